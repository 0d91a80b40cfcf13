module sluice

go 1.24
