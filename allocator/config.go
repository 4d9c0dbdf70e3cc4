package allocator

import (
	"fmt"
	"math"
	"math/bits"
	"os"
	"slices"
	"strconv"
	"strings"
)

const (
	mib = 1 << 20

	minBlockSize      = 512      // kMinBlockSize: every size is a multiple of this
	smallSize         = 1 * mib  // requests up to this go to the small pool
	smallBuffer       = 2 * mib  // classic small segment size
	minLargeAlloc     = 10 * mib // classic: requests below this get a large-segment-size segment
	roundLarge        = 2 * mib  // classic: large segments round to this
	numRoundupBuckets = 16       // roundup_power2_divisions buckets: 1 MiB .. 32 GiB and above
)

// EnvVar is the environment variable ConfigFromEnv reads.
const EnvVar = "VMMALLOC_CONF"

// Config is the allocator's policy. The zero value is not valid; start from
// DefaultConfig or ParseConfig.
type Config struct {
	// Device is the device ordinal the allocator serves.
	Device int
	// ExpandableSegments selects expandable segments (true, the default) or
	// the classic one-mapping-per-segment algorithm (the PyTorch baseline).
	// Key: expandable_segments.
	ExpandableSegments bool
	// MaxSplitSize: classic free blocks of at least this many bytes are never
	// split. 0 means unlimited. Expandable segments ignore it: their free
	// handles are unmapped instead (see package doc). Key: max_split_size_mb.
	MaxSplitSize uint64
	// MaxNonSplitRounding is how much larger than a request an oversize
	// block may be and still be handed out. Key: max_non_split_rounding_mb.
	MaxNonSplitRounding uint64
	// RoundupPower2Divisions[i] rounds requests in the i-th power-of-two
	// bucket (bucket 0 is below 1 MiB... see roundSize) up to 1/d steps
	// between powers of two; 0 or 1 rounds to 512 bytes only.
	// Key: roundup_power2_divisions, "4" or "[256:1,512:2,>:8]".
	RoundupPower2Divisions [numRoundupBuckets]int
	// GarbageCollectionThreshold in (0,1): when a memory fraction is set and
	// reserved memory exceeds this share of it, free cached memory is
	// released before growing. 0 disables. Key: garbage_collection_threshold.
	GarbageCollectionThreshold float64
	// PerProcessMemoryFraction in (0,1] caps reserved memory at this share
	// of the device total. Key: per_process_memory_fraction.
	PerProcessMemoryFraction float64
	// LargeSegmentSize is the page size (bytes per physical handle) of the
	// large pool, and the classic large segment size. Key:
	// large_segment_size_mb.
	LargeSegmentSize uint64
	// ExpandableHandleSize, for expandable segments: a growth of the large
	// pool that maps at least this many bytes cuts them into physical
	// handles of this size (the last one shorter), created fresh; smaller
	// growths map pages (LargeSegmentSize), from the handle cache first.
	// LargeSegmentSize or less (0 too) always maps pages. Larger handles
	// mean fewer driver calls per byte mapped and released, but a handle
	// is unmapped only whole, so holes smaller than one stay mapped. Key:
	// expandable_handle_mb.
	ExpandableHandleSize uint64
	// SmallSegmentSize is the page size of the small pool. Key:
	// small_segment_size_mb.
	SmallSegmentSize uint64
	// ReleaseThreshold is how many bytes of free mapped memory Synchronize
	// keeps cached; the excess is unmapped (CUDA's pool release threshold).
	// math.MaxUint64 keeps everything. Key: release_threshold_mb.
	ReleaseThreshold uint64
	// HandleCacheSize is how many bytes of unmapped physical handles each
	// pool keeps for reuse. Key: handle_cache_mb.
	HandleCacheSize uint64
	// HandleReserve is how many bytes of created handles a background
	// goroutine keeps in the large pool's handle cache (an eighth as much
	// in the small pool's), so that a growing Malloc maps handles rather
	// than creates them; 0 (the default) keeps none (reserve.go). Key:
	// handle_reserve_mb.
	HandleReserve uint64
	// DefragThreshold, for expandable segments: when growth would make a
	// pool's mapped bytes exceed (1+DefragThreshold) × its high water mark
	// of allocated bytes (the most allocated plus the request seen by a
	// growth) plus one page, idle streams' free handles and then the
	// requesting stream's free handles stranded in holes are unmapped
	// first (the latter after synchronising that stream) and the growth
	// maps where the heap grows. Negative disables it (PyTorch's
	// behaviour: never synchronise on growth). Key: defrag_threshold, a
	// number ≥ 0 or "off".
	DefragThreshold float64
	// MaxSegmentsPerPool bounds the expandable VA reservations of a pool;
	// with two pools the VA reserved per device is at most
	// 2 × MaxSegmentsPerPool × 9/8 × device memory, whatever the number of
	// streams. Key: max_segments_per_pool.
	MaxSegmentsPerPool int
	// OwnedBufferGC: when owned Buffers (NewBuffer) hold memory, the
	// out-of-memory ladder runs a garbage collection, waits for the
	// cleanups of the Buffers it found unreachable, and retries before it
	// releases the cache and reports out of memory (owned.go). Default
	// true. Key: owned_buffer_gc, True or False.
	OwnedBufferGC bool
	// PlannedSteps: once MarkStep marks the end of each step, a pool whose
	// steps repeat the same calls serves them from an offline-packed
	// region (planned.go). Nothing changes until MarkStep is called.
	// Default true. Key: planned_steps, True or False.
	PlannedSteps bool
	// Backend names the driver a program should open (backend/drivers):
	// "native", PyTorch's value and the default, leaves the choice to the
	// program (the CLI opens the emulator); "emulated", "cuda" or "acl"
	// names one. The allocator itself runs over whatever driver it is given.
	// Key: backend.
	Backend string
}

// Backends are the values the backend key accepts.
var Backends = []string{"native", "emulated", "cuda", "acl"}

// DefaultConfig is the configuration used when nothing is set.
func DefaultConfig() Config {
	return Config{
		ExpandableSegments:       true,
		MaxNonSplitRounding:      20 * mib,
		PerProcessMemoryFraction: 1,
		LargeSegmentSize:         20 * mib,
		ExpandableHandleSize:     64 * mib,
		SmallSegmentSize:         2 * mib,
		ReleaseThreshold:         math.MaxUint64,
		HandleCacheSize:          256 * mib,
		MaxSegmentsPerPool:       2,
		DefragThreshold:          0.01,
		OwnedBufferGC:            true,
		PlannedSteps:             true,
		Backend:                  "native",
	}
}

// ConfigFromEnv parses $VMMALLOC_CONF over DefaultConfig.
func ConfigFromEnv() (Config, error) { return ParseConfig(os.Getenv(EnvVar)) }

// ParseConfig parses a PYTORCH_CUDA_ALLOC_CONF-style string of
// comma-separated key:value pairs over DefaultConfig. An unknown key, a
// bad value, or a key set twice (PyTorch silently keeps the last) is an
// error wrapping ErrInvalidConfig that names it.
func ParseConfig(s string) (Config, error) {
	return ParseConfigOver(DefaultConfig(), s)
}

// ParseConfigOver parses s like ParseConfig, but over base instead of the
// defaults: keys s sets replace base's values, the rest of base stays (a
// command line's --config over $VMMALLOC_CONF). A key set twice within s is
// still an error. It returns the zero Config with any error.
func ParseConfigOver(base Config, s string) (Config, error) {
	c := base
	if err := ParsePairs(s, ErrInvalidConfig, c.set); err != nil {
		return Config{}, err
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// ParsePairs is the grammar of VMMALLOC_CONF (and of the pinned host
// allocator's VMMALLOC_HOST_CONF): comma-separated key:value pairs, commas
// inside brackets not splitting, spaces around keys and values ignored. It
// calls set for each pair in order. A pair with no value, or a key set
// twice, is an error wrapping invalid that names the key (PyTorch lets the
// last setting win silently; a key set twice is almost always two
// configurations pasted together); set's errors are returned as they are.
func ParsePairs(s string, invalid error, set func(k, v string) error) error {
	seen := make(map[string]bool)
	for _, kv := range splitTop(s) {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, ":")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || v == "" {
			return fmt.Errorf("%w: %q has no value (want key:value)", invalid, k)
		}
		if seen[k] {
			return fmt.Errorf("%w: %s is set more than once", invalid, k)
		}
		seen[k] = true
		if err := set(k, v); err != nil {
			return err
		}
	}
	return nil
}

// splitTop splits at commas outside brackets.
func splitTop(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, r := range s {
		switch r {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	return append(out, s[start:])
}

// parseBool reads a True/False value (any case, or 1/0) of key k.
func parseBool(k, v string) (bool, error) {
	switch strings.ToLower(v) {
	case "true", "1":
		return true, nil
	case "false", "0":
		return false, nil
	}
	return false, badValue(k, v, "want True or False")
}

func badValue(k, v, why string) error {
	return fmt.Errorf("%w: %s: bad value %q: %s", ErrInvalidConfig, k, v, why)
}

func parseMB(k, v string, min uint64) (uint64, error) {
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, badValue(k, v, "want a whole number of MiB")
	}
	if n < min || n > 1<<24 {
		return 0, badValue(k, v, fmt.Sprintf("want %d..%d", min, 1<<24))
	}
	return n * mib, nil
}

func parseFrac(k, v string, lo, hi float64, hiIncl bool) (float64, error) {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) {
		return 0, badValue(k, v, "want a number")
	}
	if f <= lo || f > hi || (!hiIncl && f == hi) {
		return 0, badValue(k, v, fmt.Sprintf("want a number in (%g,%g%s", lo, hi, map[bool]string{true: "]", false: ")"}[hiIncl]))
	}
	return f, nil
}

func (c *Config) set(k, v string) error {
	var err error
	switch k {
	case "expandable_segments":
		b, err := parseBool(k, v)
		if err != nil {
			return err
		}
		c.ExpandableSegments = b
	case "max_split_size_mb":
		c.MaxSplitSize, err = parseMB(k, v, 20)
	case "max_non_split_rounding_mb":
		c.MaxNonSplitRounding, err = parseMB(k, v, 0)
	case "large_segment_size_mb":
		c.LargeSegmentSize, err = parseMB(k, v, 2)
	case "expandable_handle_mb":
		c.ExpandableHandleSize, err = parseMB(k, v, 0)
	case "small_segment_size_mb":
		c.SmallSegmentSize, err = parseMB(k, v, 1)
	case "handle_cache_mb":
		c.HandleCacheSize, err = parseMB(k, v, 0)
	case "handle_reserve_mb":
		c.HandleReserve, err = parseMB(k, v, 0)
	case "release_threshold_mb":
		if strings.EqualFold(v, "none") {
			c.ReleaseThreshold = math.MaxUint64
			return nil
		}
		c.ReleaseThreshold, err = parseMB(k, v, 0)
	case "garbage_collection_threshold":
		c.GarbageCollectionThreshold, err = parseFrac(k, v, 0, 1, false)
	case "per_process_memory_fraction":
		c.PerProcessMemoryFraction, err = parseFrac(k, v, 0, 1, true)
	case "defrag_threshold":
		if strings.EqualFold(v, "off") {
			c.DefragThreshold = -1
			return nil
		}
		f, perr := strconv.ParseFloat(v, 64)
		if perr != nil || math.IsNaN(f) || f < 0 || f > 100 {
			return badValue(k, v, "want a number in [0,100] or off")
		}
		c.DefragThreshold = f
	case "max_segments_per_pool":
		n, perr := strconv.Atoi(v)
		if perr != nil || n < 1 || n > 64 {
			return badValue(k, v, "want 1..64")
		}
		c.MaxSegmentsPerPool = n
	case "planned_steps":
		b, err := parseBool(k, v)
		if err != nil {
			return err
		}
		c.PlannedSteps = b
	case "owned_buffer_gc":
		b, err := parseBool(k, v)
		if err != nil {
			return err
		}
		c.OwnedBufferGC = b
	case "roundup_power2_divisions":
		return c.setRoundup(k, v)
	case "backend":
		if !slices.Contains(Backends, v) {
			return badValue(k, v, "want one of "+strings.Join(Backends, ", "))
		}
		c.Backend = v
	default:
		return fmt.Errorf("%w: unknown key %q", ErrInvalidConfig, k)
	}
	return err
}

func parseDiv(k, v string) (int, error) {
	d, err := strconv.Atoi(v)
	if err != nil || d < 0 || d > 1<<20 || (d > 0 && d&(d-1) != 0) {
		return 0, badValue(k, v, "divisions must be 0 or a power of two")
	}
	return d, nil
}

// setRoundup parses "4" (every bucket) or "[256:1,512:2,>:8]" where each key
// is a power-of-two size in MiB starting a bucket and ">" sets every later
// bucket.
func (c *Config) setRoundup(k, v string) error {
	if !strings.HasPrefix(v, "[") {
		d, err := parseDiv(k, v)
		if err != nil {
			return err
		}
		for i := range c.RoundupPower2Divisions {
			c.RoundupPower2Divisions[i] = d
		}
		return nil
	}
	if !strings.HasSuffix(v, "]") {
		return badValue(k, v, "unterminated list")
	}
	body := strings.TrimSpace(v[1 : len(v)-1])
	if body == "" {
		return badValue(k, v, "empty list")
	}
	last := -1
	for _, ent := range strings.Split(body, ",") {
		key, val, ok := strings.Cut(strings.TrimSpace(ent), ":")
		if !ok {
			return badValue(k, ent, "want size_mb:divisions")
		}
		d, err := parseDiv(k, strings.TrimSpace(val))
		if err != nil {
			return err
		}
		key = strings.TrimSpace(key)
		if key == ">" {
			for i := last + 1; i < numRoundupBuckets; i++ {
				c.RoundupPower2Divisions[i] = d
			}
			last = numRoundupBuckets
			continue
		}
		mb, err := strconv.ParseUint(key, 10, 64)
		if err != nil || mb == 0 || mb&(mb-1) != 0 {
			return badValue(k, key, "bucket must be a power-of-two size in MiB")
		}
		i := bits.Len64(mb) - 1
		if i >= numRoundupBuckets {
			return badValue(k, key, "bucket above 32768 MiB")
		}
		if i <= last {
			return badValue(k, key, "buckets must ascend")
		}
		c.RoundupPower2Divisions[i] = d
		last = i
	}
	return nil
}

// Validate reports whether c is usable; errors wrap ErrInvalidConfig and name
// the field.
func (c Config) Validate() error {
	bad := func(field string, why string) error {
		return fmt.Errorf("%w: %s: %s", ErrInvalidConfig, field, why)
	}
	switch {
	case c.Device < 0:
		return bad("Device", "negative")
	case c.LargeSegmentSize == 0 || c.LargeSegmentSize%mib != 0:
		return bad("large_segment_size_mb", "must be a positive whole number of MiB")
	case c.ExpandableHandleSize%mib != 0 || c.ExpandableHandleSize > 1<<24*mib:
		return bad("expandable_handle_mb", "must be a whole number of MiB, at most 16 TiB")
	case c.SmallSegmentSize == 0 || c.SmallSegmentSize%mib != 0:
		return bad("small_segment_size_mb", "must be a positive whole number of MiB")
	case c.SmallSegmentSize > c.LargeSegmentSize:
		return bad("small_segment_size_mb", "larger than large_segment_size_mb")
	case c.MaxSplitSize != 0 && c.MaxSplitSize < 20*mib:
		return bad("max_split_size_mb", "must be at least 20")
	case !(c.PerProcessMemoryFraction > 0 && c.PerProcessMemoryFraction <= 1):
		return bad("per_process_memory_fraction", "must be in (0,1]")
	case c.GarbageCollectionThreshold < 0 || c.GarbageCollectionThreshold >= 1 || math.IsNaN(c.GarbageCollectionThreshold):
		return bad("garbage_collection_threshold", "must be in [0,1)")
	case math.IsNaN(c.DefragThreshold) || c.DefragThreshold > 100:
		return bad("defrag_threshold", "must be at most 100, or negative for off")
	case c.MaxSegmentsPerPool < 1:
		return bad("max_segments_per_pool", "must be at least 1")
	}
	for i, d := range c.RoundupPower2Divisions {
		if d < 0 || (d > 0 && d&(d-1) != 0) {
			return bad("roundup_power2_divisions", fmt.Sprintf("bucket %d: %d is not a power of two", i, d))
		}
	}
	return nil
}

// String renders c in the key:value form ParseConfig reads.
func (c Config) String() string {
	b := &strings.Builder{}
	fmt.Fprintf(b, "expandable_segments:%v", map[bool]string{true: "True", false: "False"}[c.ExpandableSegments])
	if c.MaxSplitSize != 0 {
		fmt.Fprintf(b, ",max_split_size_mb:%d", c.MaxSplitSize/mib)
	}
	fmt.Fprintf(b, ",max_non_split_rounding_mb:%d", c.MaxNonSplitRounding/mib)
	fmt.Fprintf(b, ",large_segment_size_mb:%d,small_segment_size_mb:%d", c.LargeSegmentSize/mib, c.SmallSegmentSize/mib)
	if c.ExpandableHandleSize != DefaultConfig().ExpandableHandleSize {
		fmt.Fprintf(b, ",expandable_handle_mb:%d", c.ExpandableHandleSize/mib)
	}
	if c.ReleaseThreshold != math.MaxUint64 {
		fmt.Fprintf(b, ",release_threshold_mb:%d", c.ReleaseThreshold/mib)
	}
	fmt.Fprintf(b, ",handle_cache_mb:%d", c.HandleCacheSize/mib)
	if c.HandleReserve != 0 {
		fmt.Fprintf(b, ",handle_reserve_mb:%d", c.HandleReserve/mib)
	}
	fmt.Fprintf(b, ",max_segments_per_pool:%d", c.MaxSegmentsPerPool)
	if c.DefragThreshold < 0 {
		b.WriteString(",defrag_threshold:off")
	} else {
		fmt.Fprintf(b, ",defrag_threshold:%g", c.DefragThreshold)
	}
	if !c.OwnedBufferGC {
		b.WriteString(",owned_buffer_gc:False")
	}
	if !c.PlannedSteps {
		b.WriteString(",planned_steps:False")
	}
	if c.Backend != "" && c.Backend != "native" {
		fmt.Fprintf(b, ",backend:%s", c.Backend)
	}
	if c.GarbageCollectionThreshold != 0 {
		fmt.Fprintf(b, ",garbage_collection_threshold:%g", c.GarbageCollectionThreshold)
	}
	if c.PerProcessMemoryFraction != 1 {
		fmt.Fprintf(b, ",per_process_memory_fraction:%g", c.PerProcessMemoryFraction)
	}
	var divs []string
	for i, d := range c.RoundupPower2Divisions {
		if d != 0 {
			divs = append(divs, fmt.Sprintf("%d:%d", uint64(1)<<i, d))
		}
	}
	if len(divs) > 0 {
		fmt.Fprintf(b, ",roundup_power2_divisions:[%s]", strings.Join(divs, ","))
	}
	return b.String()
}
