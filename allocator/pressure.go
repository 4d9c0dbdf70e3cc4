package allocator

import "math"

// Pressure: the handle size a growth maps.
//
// A physical handle is unmapped only whole, so free memory inside a handle
// that still holds one allocated byte is stranded: no other request can
// use it unless it fits there, and no defragmentation or out-of-memory
// release can return it. The larger the handles, the more each partly free
// one strands (up to a handle); the smaller, the more driver calls each
// growth and release makes (three per handle mapped, two per handle
// released). Which handles will end up partly free is unknown when they
// are mapped, so the choice follows the room left:
//
//   - while the process may still map as much again as it has reserved
//     (reserved bytes after the growth at most pressureNum/pressureDen of
//     the memory it may use: the device, per_process_memory_fraction, and
//     for a private pool its MemoryLimit), growths map large handles
//     (expandable_handle_mb) and pages (large_segment_size_mb): even if
//     every one of them ended up stranded, what is left would hold them
//     again, and a workload that stays there makes today's driver calls;
//   - above it every growth maps granule handles (2 MiB), so every free
//     granule there can be unmapped by defragmentation before the next
//     growth and by the ladder's release, and remapped where the heap
//     grows.
//
// What a partly free large handle costs under pressure is what it strands
// at the moment a growth fails: on cs336_ctx512_fullstep, whose heap is
// fragmented from its start, the handles mapped below the line cost 2.2 %
// of peak allocated in minimum capacity (README, "The default policy under
// pressure"), against 0.3 % with granule handles everywhere and 17× the
// driver calls.
const (
	pressureNum = 1
	pressureDen = 2
)

// underPressure reports whether mapping n more bytes for pool p would
// take the reserved memory past pressureNum/pressureDen of the memory the
// process may use (allowed), or p's reserved memory past that share of
// p's memory limit. Growths in flight count. mu held.
func (a *Allocator) underPressure(p *Pool, n uint64) bool {
	after := uint64(a.st.ReservedBytes[0].Current) + a.mappingBytes + n
	if after > a.allowed/pressureDen*pressureNum {
		return true
	}
	if p.limit == math.MaxUint64 {
		return false
	}
	return uint64(a.poolRec(p).ReservedBytes[0].Current)+p.mapping+n > p.limit/pressureDen*pressureNum
}
