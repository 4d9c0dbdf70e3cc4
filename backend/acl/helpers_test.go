package acl_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/acl"
)

// The test double is built once per test binary into a temporary directory:
// libascendcl.so (the process under test) and a copy, peer/libascendcl.so,
// that dlopen loads as a second, independent instance standing for another
// process in the IPC cases.
var (
	libPath  string
	peerPath string
	skipWhy  string // why the double is unavailable, if it is
	main_    *fake  // control of libPath's copy
	peer     *fake  // control of peerPath's copy
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fakeacl")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	skipWhy = build(dir)
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// build compiles testdata/fakeacl.c; it returns why it could not.
func build(dir string) string {
	if runtime.GOOS != "linux" {
		return "the ACL test double needs Linux (memfd_create)"
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		return fmt.Sprintf("no C compiler (%s) to build the ACL test double: %v", cc, err)
	}
	libPath = filepath.Join(dir, "libascendcl.so")
	peerPath = filepath.Join(dir, "peer", "libascendcl.so")
	if err := os.MkdirAll(filepath.Dir(peerPath), 0o755); err != nil {
		return err.Error()
	}
	for _, out := range []string{libPath, peerPath} {
		cmd := exec.Command(cc, "-std=c11", "-O1", "-Wall", "-Werror", "-shared", "-fPIC", "-o", out,
			"testdata/fakeacl.c", "-lpthread")
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Sprintf("building the ACL test double with %s failed: %v\n%s", cc, err, b)
		}
	}
	var err error
	if main_, err = openFake(libPath); err != nil {
		return err.Error()
	}
	if peer, err = openFake(peerPath); err != nil {
		return err.Error()
	}
	// The peer is another process: its own pid, and each imports what the
	// other exported.
	purego.SyscallN(peer.setPid, uintptr(os.Getpid()+1))
	purego.SyscallN(main_.connect, peer.lookup)
	purego.SyscallN(peer.connect, main_.lookup)
	return ""
}

// needDouble skips t when the double could not be built.
func needDouble(t testing.TB) {
	t.Helper()
	if skipWhy != "" {
		t.Skip(skipWhy)
	}
}

// fake is the control surface of one loaded copy of the double.
type fake struct {
	dl                                                     uintptr
	setDevices, setCapacity, setGranularity, setPid        uintptr
	setStrict, fail, live, calls, lookup, connect          uintptr
	reserve, release, mallocPhysical, freePhysical, mapMem uintptr
	unmapMem, setAccess, getAccess, setDevice, aclInit     uintptr
	exportSh, importSh, setPids, createStream, memcpy      uintptr
	mallocHost, hostRegister, getMemInfo, retain           uintptr
	clearContext, hold, launch, complete, failArmed        uintptr
	backingErrors                                          uintptr
}

func openFake(path string) (*fake, error) {
	dl, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, err
	}
	f := &fake{dl: dl}
	for name, p := range map[string]*uintptr{
		"fakeacl_set_devices": &f.setDevices, "fakeacl_set_capacity": &f.setCapacity,
		"fakeacl_set_granularity": &f.setGranularity, "fakeacl_set_pid": &f.setPid,
		"fakeacl_set_strict": &f.setStrict, "fakeacl_fail": &f.fail, "fakeacl_live": &f.live,
		"fakeacl_calls": &f.calls, "fakeacl_lookup": &f.lookup, "fakeacl_connect": &f.connect,
		"aclrtReserveMemAddress": &f.reserve, "aclrtReleaseMemAddress": &f.release,
		"aclrtMallocPhysical": &f.mallocPhysical, "aclrtFreePhysical": &f.freePhysical,
		"aclrtMapMem": &f.mapMem, "aclrtUnmapMem": &f.unmapMem, "aclrtMemSetAccess": &f.setAccess,
		"aclrtMemGetAccess": &f.getAccess, "aclrtSetDevice": &f.setDevice, "aclInit": &f.aclInit,
		"aclrtMemExportToShareableHandle": &f.exportSh, "aclrtMemImportFromShareableHandle": &f.importSh,
		"aclrtMemSetPidToShareableHandle": &f.setPids, "aclrtCreateStream": &f.createStream,
		"aclrtMemcpyAsync": &f.memcpy, "aclrtMallocHost": &f.mallocHost, "aclrtHostRegister": &f.hostRegister,
		"aclrtGetMemInfo": &f.getMemInfo, "aclrtMemRetainAllocationHandle": &f.retain,
		"fakeacl_clear_context": &f.clearContext, "fakeacl_hold": &f.hold, "fakeacl_launch": &f.launch,
		"fakeacl_complete": &f.complete, "fakeacl_fail_armed": &f.failArmed,
		"fakeacl_backing_errors": &f.backingErrors,
	} {
		if *p, err = purego.Dlsym(dl, name); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	return f, nil
}

// liveObjects is what fakeacl_live reports.
type liveObjects struct {
	Reservations, Mappings, Handles, Streams, Events, HostBlocks, HostRegs, Exports int64
	Used                                                                            [8]uint64 // bytes per device
}

func (f *fake) objects() liveObjects {
	var n [8]int64
	var l liveObjects
	purego.SyscallN(f.live, uintptr(unsafe.Pointer(&n)), uintptr(unsafe.Pointer(&l.Used)))
	l.Reservations, l.Mappings, l.Handles, l.Streams = n[0], n[1], n[2], n[3]
	l.Events, l.HostBlocks, l.HostRegs, l.Exports = n[4], n[5], n[6], n[7]
	return l
}

// backingError reports the phys the copy found with a changed backing (a
// memfd closed, or closed and its number reused, behind its back), naming
// the first, and forgets them; nil if none.
func (f *fake) backingError() error {
	var why [256]byte
	n, _, _ := purego.SyscallN(f.backingErrors, uintptr(unsafe.Pointer(&why[0])), uintptr(len(why)), 1)
	if int64(n) == 0 {
		return nil
	}
	msg := string(why[:])
	if i := strings.IndexByte(msg, 0); i >= 0 {
		msg = msg[:i]
	}
	return fmt.Errorf("the ACL double found %d handles whose memfd was closed or replaced behind its back (a test closed a file descriptor it does not own), the first at %s", int64(n), msg)
}

// failAt makes the nth call of sym return code, until the test ends.
func (f *fake) failAt(t testing.TB, sym string, nth int, code int32) {
	b := append([]byte(sym), 0)
	purego.SyscallN(f.fail, uintptr(unsafe.Pointer(&b[0])), uintptr(nth), uintptr(code))
	runtime.KeepAlive(b)
	t.Cleanup(func() { purego.SyscallN(f.fail, uintptr(unsafe.Pointer(&b[0])), 0, 0) })
}

// fired reports whether the failure armed by failAt has happened.
func (f *fake) fired() bool {
	n, _, _ := purego.SyscallN(f.failArmed)
	return n == 0
}

// strictMode turns strict mode on until the test ends.
func (f *fake) strictMode(t testing.TB) {
	purego.SyscallN(f.setStrict, 1)
	t.Cleanup(func() { purego.SyscallN(f.setStrict, 0) })
}

// capacity sets device dev's capacity until the test ends.
func (f *fake) capacity(t testing.TB, dev int, bytes uint64) {
	purego.SyscallN(f.setCapacity, uintptr(dev), uintptr(bytes))
	t.Cleanup(func() { purego.SyscallN(f.setCapacity, uintptr(dev), 1<<30) })
}

// open opens the binding over the main copy and, when t ends, closes it and
// requires that the double holds nothing any more.
func open(t testing.TB, opts ...acl.Option) *acl.Driver {
	t.Helper()
	needDouble(t)
	d, err := acl.Open(append([]acl.Option{acl.WithLibrary(libPath)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, d.Close())
		require.NoError(t, main_.backingError())
		require.Equal(t, liveObjects{}, main_.objects(), "the double still holds objects after Close")
	})
	return d
}

// hostView gives the conformance suite's data cases a host view of the
// double's memory, which is real host memory at the device address (a real
// device's memory is not host-addressable; that is what Copier is for), and
// its ordering cases control over when work completes
// (conformance.Workload).
type hostView struct {
	*acl.Driver
	f *fake // the copy of the double d runs on
}

func (h hostView) ctl(fn uintptr, args ...uintptr) error {
	if r, _, _ := purego.SyscallN(fn, args...); int32(r) != 0 {
		return fmt.Errorf("fakeacl control call: aclError %d", int32(r))
	}
	return nil
}

func (h hostView) Hold(s backend.Stream) error { return h.ctl(h.f.hold, uintptr(s)) }

func (h hostView) Launch(s backend.Stream, va uintptr, size uint64) error {
	if _, _, err := h.AddressRange(va); err != nil {
		return err
	}
	return h.ctl(h.f.launch, uintptr(s))
}

func (h hostView) CompleteN(s backend.Stream, n int) error {
	return h.ctl(h.f.complete, uintptr(s), uintptr(n))
}

func (h hostView) Bytes(va uintptr, size uint64) ([]byte, error) {
	base, n, err := h.AddressRange(va)
	if err != nil {
		return nil, err
	}
	if size == 0 || uint64(va-base)+size > n {
		return nil, fmt.Errorf("%#x+%d is not inside one mapping: %w", va, size, backend.ErrInvalidArgument)
	}
	if f, err := h.GetAccess(va, backend.Location{Type: backend.LocationDevice}); err != nil || f == backend.AccessNone {
		return nil, errors.Join(err, fmt.Errorf("mapping at %#x is not accessible: %w", base, backend.ErrInvalidArgument))
	}
	p := *(*unsafe.Pointer)(unsafe.Pointer(&va))
	return unsafe.Slice((*byte)(p), size), nil
}

// otherProcess is the importing process of the IPC cases: the binding over
// the peer copy, told the size of what it imports by the exporter, as an
// application sends it along with the shareable handle.
type otherProcess struct {
	hostView
	exporter *acl.Driver
}

func (o otherProcess) Import(sh uint64, dev int) (backend.Handle, error) {
	size, _ := o.exporter.ExportedSize(sh)
	return o.ImportSized(sh, dev, size)
}

func openPeer(t testing.TB, exporter *acl.Driver) otherProcess {
	t.Helper()
	d, err := acl.Open(acl.WithLibrary(peerPath))
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, d.Close())
		require.NoError(t, peer.backingError())
		require.Equal(t, liveObjects{}, peer.objects(), "the peer still holds objects after Close")
	})
	return otherProcess{hostView{d, peer}, exporter}
}
