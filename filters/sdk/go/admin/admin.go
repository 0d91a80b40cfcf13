// Package admin exports sluice_admin for a filter that implements sluice.AdminFilter:
//
//	import _ "sluice/admin"
package admin

import "sluice"

//go:wasmexport sluice_admin
func admin(ptr, size int32) int64 { return sluice.HandleAdmin(ptr, size) }
