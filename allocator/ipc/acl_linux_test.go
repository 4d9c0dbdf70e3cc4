//go:build linux

package ipc_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/ipc"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/acl"
)

// The ACL test double (backend/acl/testdata/fakeacl.c) built twice: one
// copy for the exporting process, one loaded as a second instance that
// stands for the importing process (its own pid, connected to the first).
var aclDouble struct {
	once      sync.Once
	lib, peer string
	peerPid   int32
	skip      string
}

func aclPair(t *testing.T) (exporter, importer *acl.Driver) {
	t.Helper()
	aclDouble.once.Do(func() {
		cc := os.Getenv("CC")
		if cc == "" {
			cc = "cc"
		}
		if _, err := exec.LookPath(cc); err != nil {
			aclDouble.skip = "no C compiler for the ACL test double"
			return
		}
		dir, err := os.MkdirTemp("", "ipcacl") // kept: the libraries stay loaded
		if err != nil {
			aclDouble.skip = err.Error()
			return
		}
		aclDouble.lib = filepath.Join(dir, "libascendcl.so")
		aclDouble.peer = filepath.Join(dir, "peer", "libascendcl.so")
		if err := os.MkdirAll(filepath.Dir(aclDouble.peer), 0o755); err != nil {
			aclDouble.skip = err.Error()
			return
		}
		for _, out := range []string{aclDouble.lib, aclDouble.peer} {
			if b, err := exec.Command(cc, "-std=c11", "-O1", "-shared", "-fPIC", "-o", out,
				"../../backend/acl/testdata/fakeacl.c", "-lpthread").CombinedOutput(); err != nil {
				aclDouble.skip = "building the ACL double: " + err.Error() + "\n" + string(b)
				return
			}
		}
		sym := func(lib, name string) uintptr {
			dl, err := purego.Dlopen(lib, purego.RTLD_NOW|purego.RTLD_LOCAL)
			if err != nil {
				panic(err)
			}
			p, err := purego.Dlsym(dl, name)
			if err != nil {
				panic(err)
			}
			return p
		}
		aclDouble.peerPid = int32(os.Getpid() + 1)
		purego.SyscallN(sym(aclDouble.peer, "fakeacl_set_pid"), uintptr(aclDouble.peerPid))
		purego.SyscallN(sym(aclDouble.lib, "fakeacl_connect"), sym(aclDouble.peer, "fakeacl_lookup"))
		purego.SyscallN(sym(aclDouble.peer, "fakeacl_connect"), sym(aclDouble.lib, "fakeacl_lookup"))
	})
	if aclDouble.skip != "" {
		t.Skip(aclDouble.skip)
	}
	var err error
	exporter, err = acl.Open(acl.WithLibrary(aclDouble.lib))
	require.NoError(t, err)
	importer, err = acl.Open(acl.WithLibrary(aclDouble.peer))
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, importer.Close())
		require.NoError(t, exporter.Close())
	})
	return exporter, importer
}

// TestACLWhitelist runs the pid whitelist through the ACL binding and its
// double: validation is on by default, so an export names its importers;
// an importer not named is refused (ErrNotPermitted) and holds nothing;
// DisablePidValidation admits anybody.
func TestACLWhitelist(t *testing.T) {
	rows := []struct {
		name string
		opts func(peer int32) ipc.ExportOptions
		want error
	}{
		{"whitelisted", func(peer int32) ipc.ExportOptions { return ipc.ExportOptions{Pids: []int32{peer}} }, nil},
		{"nobody whitelisted", func(int32) ipc.ExportOptions { return ipc.ExportOptions{} }, backend.ErrNotPermitted},
		{"another pid whitelisted", func(peer int32) ipc.ExportOptions { return ipc.ExportOptions{Pids: []int32{peer + 1}} }, backend.ErrNotPermitted},
		{"validation disabled", func(int32) ipc.ExportOptions { return ipc.ExportOptions{DisablePidValidation: true} }, nil},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			exp, imp := aclPair(t)
			require.Equal(t, aclDouble.peerPid, imp.Pid())
			cfg, err := allocator.ParseConfig("large_segment_size_mb:2")
			require.NoError(t, err)
			a, err := allocator.New(exp, cfg)
			require.NoError(t, err)
			s, err := exp.StreamCreate(0)
			require.NoError(t, err)
			p, err := a.Malloc(3<<20, s)
			require.NoError(t, err)
			x, err := ipc.NewExporter(a)
			require.NoError(t, err)
			e, err := x.Export(p, r.opts(imp.Pid()))
			require.NoError(t, err)
			require.Len(t, e.Handles, 2)

			m, err := ipc.Import(imp, e.Descriptor, 0)
			if r.want != nil {
				require.ErrorIs(t, err, r.want)
				assert.Nil(t, m)
			} else {
				require.NoError(t, err)
				assert.Equal(t, uint64(3<<20), m.Size)
				require.NoError(t, m.Close())
			}
			require.NoError(t, e.Close())
			require.NoError(t, a.Free(p))
			require.NoError(t, x.Close())
			require.NoError(t, a.Close())
			require.NoError(t, exp.StreamDestroy(s))
		})
	}
}
