package allocator

import "slices"

// configKeys are the keys ParseConfig accepts, in the order the README's
// configuration table lists them.
var configKeys = []string{
	"expandable_segments",
	"max_split_size_mb",
	"max_non_split_rounding_mb",
	"roundup_power2_divisions",
	"garbage_collection_threshold",
	"per_process_memory_fraction",
	"large_segment_size_mb",
	"expandable_handle_mb",
	"small_segment_size_mb",
	"release_threshold_mb",
	"handle_cache_mb",
	"handle_reserve_mb",
	"defrag_threshold",
	"max_segments_per_pool",
	"owned_buffer_gc",
	"planned_steps",
	"backend",
}

// ConfigKeys returns the keys ParseConfig and ConfigFromEnv accept, for
// tools that list them when a key is unknown. The slice is a copy.
func ConfigKeys() []string { return slices.Clone(configKeys) }
