package sluice

// A per-call byte arena, like the C SDK's sluice_malloc: Alloc hands out slices of a few large
// chunks that the next call reuses, so a filter that builds one new value per record does not
// make the garbage collector run every few batches.

const arenaChunk = 256 << 10

var (
	arenaChunks [][]byte // every chunk, reused call after call
	arenaCur    int      // index of the chunk being filled
	arenaOff    int      // bytes used in it
)

func resetArena() {
	arenaCur, arenaOff = 0, 0
}

// Alloc returns n bytes (zeroed only the first time they are used: overwrite all of them) that
// stay valid until the current call returns: the value of a rewrite, say. Do not keep them
// across records you are not rewriting in this batch, or across batches; use make for that.
func Alloc(n int) []byte {
	if n > arenaChunk/4 {
		return make([]byte, n)
	}
	for arenaCur < len(arenaChunks) {
		c := arenaChunks[arenaCur]
		if arenaOff+n <= len(c) {
			b := c[arenaOff : arenaOff+n : arenaOff+n]
			arenaOff += n
			return b
		}
		arenaCur++
		arenaOff = 0
	}
	arenaChunks = append(arenaChunks, make([]byte, arenaChunk))
	arenaOff = n
	return arenaChunks[arenaCur][:n:n]
}
