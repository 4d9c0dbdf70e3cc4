package handlecheck

//go:generate go run gen.go

import "github.com/vmmalloc/vmmalloc/backend"

// ipcPart is backend.IPC over the wrapped driver's, with the checks: an
// exported handle must be live, an imported one is born.
type ipcPart struct {
	t *tracker
	x backend.IPC
}

func (p ipcPart) Export(h backend.Handle, flags backend.ShareFlags) (uint64, error) {
	t := p.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.handles[h].refs == 0 {
		return 0, t.violate(Violation{Kind: ExportedAfterFree, Op: backend.OpExport, Handle: h})
	}
	return p.x.Export(h, flags)
}

func (p ipcPart) SetPids(shareable uint64, pids []int32) error { return p.x.SetPids(shareable, pids) }

func (p ipcPart) Import(shareable uint64, dev int) (backend.Handle, error) {
	t := p.t
	t.mu.Lock()
	defer t.mu.Unlock()
	h, err := p.x.Import(shareable, dev)
	if err != nil {
		return h, err
	}
	if err := t.born(backend.OpImport, h); err != nil {
		return 0, err
	}
	return h, nil
}

func (p ipcPart) Pid() int32 { return p.x.Pid() }
