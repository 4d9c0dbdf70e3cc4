package segment

// Pieces appends to dst the byte ranges, as offsets from the segment's
// base, that op maps with one handle each, in address order, and returns
// the extended slice. It reads only what BeginMap set, so it needs no
// lock; callers that report a map in flight (the allocator's segment
// hooks) use it between Run and EndMap.
func (op *MapOp) Pieces(dst []Run) []Run {
	for i := range op.hs {
		lo, hi := op.s.piece(op.off, op.end, op.size, i)
		dst = append(dst, Run{Off: lo, Len: hi - lo})
	}
	return dst
}

// OK reports whether Run has mapped every piece with its access set.
func (op *MapOp) OK() bool { return op.ran && op.err == nil }

// Handles returns the handles the unmap covers, as offsets from the
// segment's base, in address order, as BeginUnmap found them. The slice is
// the op's own: the caller must not change it.
func (op *UnmapOp) Handles() []Run { return op.handles }

// Err is the driver failure Run stopped at, nil if it unmapped every
// handle (or has not run).
func (op *UnmapOp) Err() error { return op.err }
