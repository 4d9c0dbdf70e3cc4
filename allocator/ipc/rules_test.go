package ipc_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator/ipc"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// TestSeedRules reaches each IPC rule of seeds 000/004 (R15–R17, and R3's
// deferred release, in TestFreeWhileMapped) through the public API: the
// call fails with the rule's kind (and, where the driver refuses, names
// the rule), and the failing side holds nothing more than before.
func TestSeedRules(t *testing.T) {
	type state struct {
		w *world
		p uintptr
		x *ipc.Export
	}
	rows := []struct {
		rule, name string
		opts       ipc.ExportOptions
		call       func(t *testing.T, s *state) error
		kind       error
	}{
		{rule: "R16", name: "importer not whitelisted", opts: ipc.ExportOptions{Pids: []int32{3000}}, kind: backend.ErrNotPermitted,
			call: func(t *testing.T, s *state) error { _, err := ipc.Import(s.w.b, s.x.Descriptor, 0); return err }},
		{rule: "R16", name: "nobody whitelisted, validation on by default", kind: backend.ErrNotPermitted,
			call: func(t *testing.T, s *state) error { _, err := ipc.Import(s.w.b, s.x.Descriptor, 0); return err }},
		{rule: "R16", name: "whitelist nobody", kind: backend.ErrInvalidArgument,
			call: func(t *testing.T, s *state) error { return s.x.Allow() }},
		{rule: "R16", name: "whitelist a bad pid", kind: backend.ErrInvalidArgument,
			call: func(t *testing.T, s *state) error { return s.x.Allow(2000, -1) }},
		{rule: "", name: "export with a bad pid", kind: backend.ErrInvalidArgument,
			call: func(t *testing.T, s *state) error {
				_, err := s.w.x.Export(s.p, ipc.ExportOptions{Pids: []int32{0}})
				return err
			}},
		{rule: "R15", name: "import twice into one process", opts: ipc.ExportOptions{DisablePidValidation: true}, kind: backend.ErrInvalidArgument,
			call: func(t *testing.T, s *state) error {
				m, err := ipc.Import(s.w.b, s.x.Descriptor, 0)
				require.NoError(t, err)
				t.Cleanup(func() { require.NoError(t, m.Close()) })
				_, err = ipc.Import(s.w.b, s.x.Descriptor, 1)
				return err
			}},
		{rule: "R17", name: "import into the exporting process", opts: ipc.ExportOptions{DisablePidValidation: true}, kind: backend.ErrInvalidArgument,
			call: func(t *testing.T, s *state) error { _, err := ipc.Import(s.w.e, s.x.Descriptor, 0); return err }},
		{rule: "R17", name: "import onto a bad device", opts: ipc.ExportOptions{DisablePidValidation: true}, kind: backend.ErrInvalidArgument,
			call: func(t *testing.T, s *state) error { _, err := ipc.Import(s.w.b, s.x.Descriptor, 2); return err }},
		{rule: "R17", name: "import after the exporter freed", opts: ipc.ExportOptions{DisablePidValidation: true}, kind: backend.ErrInvalidArgument,
			call: func(t *testing.T, s *state) error {
				require.NoError(t, s.x.Close())
				require.NoError(t, s.w.a.Free(s.p))
				require.NoError(t, s.w.x.Close())
				require.NoError(t, s.w.a.Close())
				_, err := ipc.Import(s.w.b, s.x.Descriptor, 0)
				return err
			}},
		{rule: "", name: "export a freed pointer", kind: nil,
			call: func(t *testing.T, s *state) error {
				_, err := s.w.x.Export(s.p+512, ipc.ExportOptions{})
				return err
			}},
	}
	for _, r := range rows {
		t.Run(r.rule+" "+r.name, func(t *testing.T) {
			w := newWorld(t)
			p, err := w.a.Malloc(3<<20, w.s)
			require.NoError(t, err)
			x, err := w.x.Export(p, r.opts)
			require.NoError(t, err)
			s := &state{w: w, p: p, x: x}
			beforeB := held(w.b)
			err = r.call(t, s)
			require.Error(t, err)
			if r.kind != nil {
				require.ErrorIs(t, err, r.kind)
			}
			var be *backend.Error
			if r.rule != "" {
				require.True(t, errors.As(err, &be), "%v", err)
				assert.Equal(t, r.rule, be.Rule)
			}
			if r.name != "import twice into one process" {
				assert.Equal(t, beforeB, held(w.b), "the importer holds something after the failure")
			}
			assert.Zero(t, w.c.Live().Handles)
		})
	}
}

// held is what a process holds of the driver, without device-wide figures.
func held(p *emulated.Emulator) [5]int {
	l := p.Live()
	return [5]int{l.Handles, l.Mappings, l.Reservations, l.Imports, l.Exports}
}
