// Package trace defines vmmalloc's allocation-trace model, its binary and
// text file formats, and importers for real traces (PyTorch memory
// snapshots, RAPIDS RMM logs). Traces drive fragmentation studies: a replay
// engine feeds the events to an allocator and compares the memory it
// reserves with the trace's peak live bytes (Summarize).
//
// # Event model
//
// A trace is a sequence of Events. An Alloc introduces an allocation id
// (ID) with a size in bytes and a stream; a later Free releases it;
// RecordStream marks it as used by another stream; StreamSync says a
// stream's queued work has completed; EmptyCache asks the allocator to
// return unused memory to the device; Mark numbers a phase boundary (a
// training step, say). An id is live from its Alloc to its Free: a Free or
// RecordStream must name a live id and an Alloc must not name one (ids may
// be reused after their Free, though generators and importers never do).
// TimeNs is a timestamp in nanoseconds relative to the trace's start;
// replay ignores it, reports may use it. Summarize checks these rules.
//
// An Alloc also names the memory pool it is made in (Pool, PyTorch's
// MempoolId_t): (0, 0) is the default pool, the allocator's own cache;
// any other PoolID is a private pool, such as the one PyTorch gives each
// CUDA graph's allocations (torch.cuda.graph, graph_pool_handle) or a
// torch.cuda.MemPool. Replay allocates each private pool's Allocs from a
// pool of its own. Frees name only the id: a pointer knows its pool.
//
// Readers are streams (EventReader: Next until io.EOF), so traces larger
// than memory can be replayed. Open detects the format of a file.
//
// # Binary format (version 2)
//
// All integers are unsigned LEB128 varints (encoding/binary.Uvarint) unless
// noted; "zigzag" is a signed value d stored as the varint (d<<1)^(d>>63).
//
//	header:
//	  magic     8 bytes   "VMMTRACE"
//	  version   varint    2 (1 is read too, see below; another value: ErrVersion)
//	  nfields   varint    number of info fields, at most 16
//	  nfields × field:
//	    keylen  varint    1..64
//	    key     keylen bytes ("name", "source", "device"; unknown keys are skipped)
//	    vallen  varint    0..4096
//	    value   vallen bytes
//	events, each:
//	  tag       1 byte    bits 0-2: Kind (1 alloc, 2 free, 3 record, 4 sync,
//	                      5 empty_cache, 6 mark); bit 3: Pool present;
//	                      bit 4: ID present; bit 5: Size present;
//	                      bit 6: Stream present; bit 7: TimeNs present
//	  id        zigzag    if bit 4: ID - base, where base is the previous
//	                      Alloc's ID (0 at the start), plus 1 for an Alloc.
//	                      If absent: base for an Alloc (sequential ids cost
//	                      nothing), 0 for other kinds.
//	  size      varint    if bit 5: Size; absent means 0
//	  stream    varint    if bit 6: Stream; absent means the previous
//	                      event's Stream (0 at the start)
//	  time      zigzag    if bit 7: TimeNs minus the previous event's TimeNs
//	                      (0 at the start); absent means unchanged
//	  pool      2 varints if bit 3: Pool[0], Pool[1]; absent means (0, 0)
//	end-of-trace marker:
//	  0x00      1 byte    (a tag whose kind is 0)
//	  count     varint    number of events
//	  crc       4 bytes   little-endian CRC-32C (Castagnoli) of every
//	                      preceding byte of the file, magic through count
//
// Nothing may follow the marker. Subtractions wrap modulo 2^64, so every
// Event value round-trips exactly. A typical event is 2–5 bytes; an
// Alloc in a private pool costs two or three more.
//
// Version 1, written before pools, is version 2 without bit 3: its tag
// has a 4-bit kind (so a set bit 3 is an invalid tag) and every event is
// in the default pool. Writer always writes version 2.
//
// Reader never holds more than a 64 KiB window and does not allocate per
// event. Input that stops before the end-of-trace marker, has an invalid
// tag, an over-long varint, a count or checksum that does not match, or
// trailing data yields an error wrapping ErrCorrupt (after the events that
// decoded cleanly). A bit flip that still decodes is only caught by the
// checksum at the end.
//
// # Text format (version 2)
//
// One line per event; the first line is exactly the header
//
//	# vmmalloc-trace v2
//
// (or "# vmmalloc-trace v1" for a version-1 file, which must not use
// pool=; the readers accept both).
//
// Blank lines are ignored and "#" starts a comment that runs to the end of
// the line. Comment lines of the form "# key: value" before the first
// event set Info (keys name, source, device; surrounding white space is
// trimmed). Such a value obeys the writers' rule, at most 4096 bytes and
// no line break (a '\r' inside the line counts): otherwise the reader
// fails with ErrCorrupt, so a text trace that reads can always be written
// again (converted). Events are a keyword,
// positional numbers, then key=value fields in any order:
//
//	alloc <id> <size> [s=<stream>] [t=<ns>] [pool=<a>,<b>]
//	                                          alloc 17 1048576 s=0 t=123 pool=1,0
//	free <id> [s=<stream>] [t=<ns>]           free 17
//	record <id> s=<stream> [t=<ns>]           record 17 s=2
//	sync s=<stream> [t=<ns>]                  sync s=1
//	empty_cache [t=<ns>]                      empty_cache
//	mark <n> [t=<ns>]                         mark 3
//
// Omitted fields are 0 (pool (0, 0)). Two further keys, id=<n> and
// size=<n>, carry the fields a kind does not use positionally, and pool=
// is read on any kind, so any Event round-trips.
// TextWriter writes exactly this canonical form: s= and t= always on
// alloc, s= always on record and sync, and otherwise only nonzero fields
// (pool= only for a pool other than the default, on any kind).
// Errors name the line and wrap ErrCorrupt. The text format has no end
// marker, so a file cut at a line boundary reads as a shorter trace; use
// the binary format where that matters.
//
// # Importers
//
// ImportPyTorchSnapshot reads the pickle written by
// torch.cuda.memory._dump_snapshot through package pickle, which refuses
// anything but plain data. ImportRMMLog reads RMM's logging_resource_adaptor
// CSV. Both key allocations by address, assign fresh sequential ids, and
// count (rather than fail on) frees they cannot match, as happens when
// recording started mid-run. The PyTorch importer also turns each run of
// segment_free/segment_unmap entries (PyTorch releasing its cache) into an
// EmptyCache event, says whether the file lets PyTorch's reserved peak
// be known (PyTorchTrace.PeakReservedKnown), and puts each alloc in its
// pool: the entry's pool_id where newer PyTorch writes one, else the
// segment_pool_id of the snapshot segment that held its address
// (pytorchpools.go). RMM logs have no pools: every alloc is in the
// default pool.
package trace
