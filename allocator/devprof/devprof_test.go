package devprof_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/pprof/profile"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/devprof"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

func newAllocator(t *testing.T, dev int, drv *emulated.Emulator) *allocator.Allocator {
	t.Helper()
	cfg := allocator.DefaultConfig()
	cfg.Device = dev
	a, err := allocator.New(drv, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	return a
}

func newDriver(t *testing.T, devices int) *emulated.Emulator {
	t.Helper()
	drv, err := emulated.New(emulated.WithCapacity(8<<30), emulated.WithDevices(devices))
	require.NoError(t, err)
	t.Cleanup(func() { _ = drv.Close() })
	return drv
}

//go:noinline
func allocLarge(t *testing.T, a *allocator.Allocator) uintptr {
	p, err := a.Malloc(30<<20, 0)
	require.NoError(t, err)
	return p
}

//go:noinline
func allocSmall(t *testing.T, a *allocator.Allocator) uintptr {
	p, err := a.Malloc(4096, 0)
	require.NoError(t, err)
	return p
}

// parse writes the profile of allocs and parses it back.
func parse(t *testing.T, allocs ...*allocator.Allocator) *profile.Profile {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, devprof.Write(&buf, allocs...))
	p, err := profile.Parse(&buf)
	require.NoError(t, err)
	require.NoError(t, p.CheckValid())
	return p
}

// sums adds up each sample type over samples matching keep.
func sums(p *profile.Profile, keep func(*profile.Sample) bool) map[string]int64 {
	out := map[string]int64{}
	for _, s := range p.Sample {
		if keep != nil && !keep(s) {
			continue
		}
		for i, st := range p.SampleType {
			out[st.Type] += s.Value[i]
		}
	}
	return out
}

func leaf(s *profile.Sample) string {
	return s.Location[0].Line[0].Function.Name
}

func TestProfileInUseMatchesAllocated(t *testing.T) {
	drv := newDriver(t, 2)
	a0 := newAllocator(t, 0, drv)
	a1 := newAllocator(t, 1, drv)
	before := allocSmall(t, a0) // before recording: no stack
	require.NoError(t, a0.RecordHistory(allocator.HistoryOptions{MaxEntries: 64, Stacks: true}))
	var large []uintptr
	for range 5 {
		large = append(large, allocLarge(t, a0))
	}
	for range 7 {
		allocSmall(t, a0)
	}
	require.NoError(t, a0.Free(large[0]))
	require.NoError(t, a0.Free(before))
	allocLarge(t, a1) // a1 is not recording

	p := parse(t, a0, a1)
	assert.Equal(t, []string{"alloc_objects", "alloc_space", "inuse_objects", "inuse_space"},
		[]string{p.SampleType[0].Type, p.SampleType[1].Type, p.SampleType[2].Type, p.SampleType[3].Type})
	assert.Equal(t, "inuse_space", p.DefaultSampleType)
	assert.Equal(t, int64(1), p.Period)

	dev := func(d string) func(*profile.Sample) bool {
		return func(s *profile.Sample) bool { return s.Label["device"][0] == d }
	}
	s0 := sums(p, dev("0"))
	assert.Equal(t, int64(a0.MemoryAllocated()), s0["inuse_space"], "inuse_space is the allocated bytes of live blocks")
	assert.Equal(t, int64(11), s0["inuse_objects"])
	assert.Equal(t, int64(13), s0["alloc_objects"], "12 while recording, 1 before")
	s1 := sums(p, dev("1"))
	assert.Equal(t, int64(a1.MemoryAllocated()), s1["inuse_space"])
	assert.Equal(t, int64(1), s1["inuse_objects"])

	byLeaf := map[string]map[string]int64{}
	for _, s := range p.Sample {
		if s.Label["device"][0] != "0" {
			continue
		}
		l := leaf(s)
		if byLeaf[l] == nil {
			byLeaf[l] = map[string]int64{}
		}
		for i, st := range p.SampleType {
			byLeaf[l][st.Type] += s.Value[i]
		}
		assert.Equal(t, []string{"0"}, s.Label["stream"], "default stream")
		wantPool := "small_pool"
		if strings.HasSuffix(l, "allocLarge") {
			wantPool = "large_pool"
		}
		assert.Equal(t, []string{wantPool}, s.Label["pool"], l)
	}
	large0 := byLeaf["github.com/vmmalloc/vmmalloc/allocator/devprof_test.allocLarge"]
	assert.Equal(t, int64(4*30<<20), large0["inuse_space"])
	assert.Equal(t, int64(5*30<<20), large0["alloc_space"])
	small0 := byLeaf["github.com/vmmalloc/vmmalloc/allocator/devprof_test.allocSmall"]
	assert.Equal(t, int64(7*4096), small0["inuse_space"])
	pre := byLeaf[devprof.NoStack]
	assert.Equal(t, int64(1), pre["alloc_objects"])
	assert.Equal(t, int64(0), pre["inuse_objects"], "the block from before recording was freed")
}

func TestHandler(t *testing.T) {
	drv := newDriver(t, 1)
	a := newAllocator(t, 0, drv)
	require.NoError(t, a.RecordHistory(allocator.HistoryOptions{MaxEntries: 16, Stacks: true}))
	allocLarge(t, a)
	srv := httptest.NewServer(devprof.Handler(a))
	defer srv.Close()

	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	p, err := profile.Parse(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, int64(30<<20), sums(p, nil)["inuse_space"])

	resp2, err := http.Post(srv.URL, "text/plain", strings.NewReader("x"))
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp2.Body)
	resp2.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp2.StatusCode)
}
