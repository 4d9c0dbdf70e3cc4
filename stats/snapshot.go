package stats

// BlockState is the state of a block in a snapshot, named as PyTorch's
// memory snapshot names them.
type BlockState string

const (
	BlockActiveAllocated   BlockState = "active_allocated"    // handed out to a caller
	BlockActivePendingFree BlockState = "active_pending_free" // freed, waiting on stream events
	BlockInactive          BlockState = "inactive"            // free and mapped
	BlockUnmapped          BlockState = "unmapped"            // reserved address space without memory
)

// BlockInfo describes one block of a segment.
type BlockInfo struct {
	Address       uintptr    `json:"address"`
	Size          uint64     `json:"size"`           // bytes
	RequestedSize uint64     `json:"requested_size"` // bytes asked for; 0 unless allocated
	Stream        uint64     `json:"stream"`
	State         BlockState `json:"state"`
	// Stack names the Go call stack of the Malloc that allocated the block
	// in its recorder's stack table (1-based); 0 when none was recorded.
	Stack uint32 `json:"stack,omitempty"`
	// Pool is the memory pool owning the block (PyTorch's MempoolId_t);
	// (0, 0) for the default pool and for unmapped blocks.
	Pool [2]uint64 `json:"pool,omitzero"`
}

// SegmentInfo describes one segment: for an expandable segment, its whole
// reservation; for a classic one, its single mapping.
type SegmentInfo struct {
	Device        int         `json:"device"`
	Address       uintptr     `json:"address"`
	TotalSize     uint64      `json:"total_size"`     // bytes of address space
	MappedSize    uint64      `json:"mapped_size"`    // bytes backed by physical memory
	AllocatedSize uint64      `json:"allocated_size"` // bytes in allocated blocks
	ActiveSize    uint64      `json:"active_size"`    // bytes in active blocks
	RequestedSize uint64      `json:"requested_size"` // bytes requested in allocated blocks
	Pool          PoolKind    `json:"pool"`
	IsExpandable  bool        `json:"is_expandable"`
	PageSize      uint64      `json:"page_size"` // bytes per physical handle
	Blocks        []BlockInfo `json:"blocks"`
}

// Snapshot is the state of an allocator at one instant.
type Snapshot struct {
	Segments []SegmentInfo `json:"segments"`
}
