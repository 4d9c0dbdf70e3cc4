// Package handlecheck checks how code above the driver uses physical
// handles: it wraps a backend.Driver, follows every handle from
// CreatePhysical (or Import, or RetainHandle) to its last FreePhysical, and
// every mapping from Map to Unmap, and refuses the calls that break a
// handle's lifetime:
//
//	MappedTwice       Map of a handle that is mapped already (two addresses
//	                  would alias the same memory)
//	MappedAfterFree   Map of a handle with no live reference (freed, or never
//	                  created through the checker)
//	ExportedAfterFree Export of a handle with no live reference
//	FreedWhileMapped  FreePhysical of a handle's last reference while it is
//	                  mapped (the driver would defer it; an allocator that
//	                  does it has lost track of a mapping)
//	FreedTwice        FreePhysical of a handle with no live reference
//	ReusedWhileLive   CreatePhysical, Import or RetainHandle returned the id
//	                  of a handle that is still live by the checker's count
//	                  (the driver, or a stray close below it, made two
//	                  handles one)
//
// A refused call is not forwarded: it returns a *Violation (which wraps
// backend.ErrInvalidArgument, as the driver's own refusal would) and the
// checker records it, so a test asserts Violations or Err at the end even
// when the code under test swallowed the error. ReusedWhileLive is found
// after the driver's call: the new handle is not handed out (it stays with
// the driver).
//
// A handle's life, as the checker follows it:
//
//	       CreatePhysical, Import (refs 1)
//	                    │
//	                    ▼
//	┌──────────▶ live, unmapped ───── FreePhysical: refs-1; at 0 gone
//	│ Unmap             │ Map         (the driver may hand the id out again)
//	│                   ▼
//	└────────── live, mapped ◀─────── RetainHandle: refs+1
//	                    │
//	                    └──────────── FreePhysical: refs-1, of a retained
//	                                  reference; of the last: refused
//
// The wrapper is transparent: New(d).Driver() implements exactly the
// optional interfaces of package backend that d implements (IPC,
// HostMemory, Copier, DeviceSynchronizer, Introspector), so code that
// discovers capabilities by type assertion behaves as over d. Methods of d
// outside those interfaces (an emulator's fault injection, a binding's
// Close) are not forwarded: keep d for them. Every call is safe for
// concurrent use; the calls that change a handle's life (create, import,
// retain, free, map, unmap) hold the checker's lock across the driver call,
// so that a free and a create that reuses the id cannot be seen out of
// order. The others go straight through.
package handlecheck

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/vmmalloc/vmmalloc/backend"
)

// Kind names a violation of a handle's lifetime.
type Kind uint8

const (
	MappedTwice Kind = iota + 1
	MappedAfterFree
	ExportedAfterFree
	FreedWhileMapped
	FreedTwice
	ReusedWhileLive
)

func (k Kind) String() string {
	switch k {
	case MappedTwice:
		return "mapped twice"
	case MappedAfterFree:
		return "mapped after free"
	case ExportedAfterFree:
		return "exported after free"
	case FreedWhileMapped:
		return "freed while mapped"
	case FreedTwice:
		return "freed twice"
	case ReusedWhileLive:
		return "id reused while live"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Violation is one refused call. It is also the error the call returns.
type Violation struct {
	Kind   Kind
	Op     backend.Op     // the call
	Handle backend.Handle // the handle it named, or the one it returned
	VA     uintptr        // Map: the address asked for; 0 otherwise
	At     uintptr        // MappedTwice, FreedWhileMapped: where the handle is mapped
}

func (v *Violation) Error() string {
	s := fmt.Sprintf("handlecheck: %v: handle %#x %v", v.Op, uint64(v.Handle), v.Kind)
	if v.VA != 0 {
		s += fmt.Sprintf(" (at %#x)", v.VA)
	}
	if v.At != 0 {
		s += fmt.Sprintf(", mapped at %#x", v.At)
	}
	return s
}

// Unwrap makes a Violation a backend.ErrInvalidArgument, the kind a driver
// gives a call naming a handle it cannot use.
func (v *Violation) Unwrap() error { return backend.ErrInvalidArgument }

// life is what the checker knows of one handle that is live (refs > 0) or
// still mapped.
type life struct {
	refs int     // creation/import + retains not yet freed
	maps int     // mappings made through the checker: 0 or 1 (a second is refused)
	at   uintptr // the address of its last mapping while maps > 0
}

// mapping is one Map the checker saw.
type mapping struct {
	h    backend.Handle
	size uint64 // nbytes
}

// tracker implements backend.Driver over drv. The generated driver types
// embed it with the parts of the optional interfaces drv implements.
type tracker struct {
	drv backend.Driver

	mu      sync.Mutex
	handles map[backend.Handle]life // live or mapped handles; mu
	maps    map[uintptr]mapping     // by address; mu
	viols   []Violation             // mu

	nviols atomic.Int64 // len(viols), read without mu
}

// Checker is a handle-lifetime checker around one driver.
type Checker struct {
	t   *tracker
	drv backend.Driver // t with the optional interfaces of the wrapped driver
}

// New wraps d. Use Driver for the wrapped driver.
func New(d backend.Driver) *Checker {
	t := &tracker{drv: d, handles: map[backend.Handle]life{}, maps: map[uintptr]mapping{}}
	return &Checker{t: t, drv: wrap(t, d)}
}

// ForTest wraps d for test t: t fails at its end if the checker recorded
// a violation. It returns the wrapped driver and the checker.
func ForTest(t testing.TB, d backend.Driver) (backend.Driver, *Checker) {
	t.Helper()
	c := New(d)
	t.Cleanup(func() {
		if err := c.Err(); err != nil {
			t.Errorf("%v", err)
		}
	})
	return c.Driver(), c
}

// Driver is the checked driver: d's methods, with the checks, and exactly
// d's optional interfaces.
func (c *Checker) Driver() backend.Driver { return c.drv }

// Count is the number of violations recorded: one atomic load, for a check
// after every operation.
func (c *Checker) Count() int { return int(c.t.nviols.Load()) }

// Violations returns the violations recorded, oldest first.
func (c *Checker) Violations() []Violation {
	c.t.mu.Lock()
	defer c.t.mu.Unlock()
	return append([]Violation(nil), c.t.viols...)
}

// Err is nil without violations, else an error listing them (the first
// ten) that wraps the first.
func (c *Checker) Err() error {
	vs := c.Violations()
	if len(vs) == 0 {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "handlecheck: %d handle-lifetime violations:", len(vs))
	for i, v := range vs {
		if i == 10 {
			fmt.Fprintf(&b, "\n\t... and %d more", len(vs)-10)
			break
		}
		b.WriteString("\n\t" + v.Error())
	}
	return &listError{msg: b.String(), first: &vs[0]}
}

// listError is Err's error.
type listError struct {
	msg   string
	first *Violation
}

func (e *listError) Error() string { return e.msg }
func (e *listError) Unwrap() error { return e.first }

// violate records v and returns it as an error; mu held.
func (t *tracker) violate(v Violation) error {
	t.viols = append(t.viols, v)
	t.nviols.Add(1)
	return &v
}

// born records a handle the driver just handed out; mu held.
func (t *tracker) born(op backend.Op, h backend.Handle) error {
	l := t.handles[h]
	if l.refs > 0 {
		return t.violate(Violation{Kind: ReusedWhileLive, Op: op, Handle: h})
	}
	l.refs = 1 // l.maps > 0: released but mapped, and the driver made it anew
	t.handles[h] = l
	return nil
}

// mappingAt returns the mapping containing va; mu held.
func (t *tracker) mappingAt(va uintptr) (mapping, bool) {
	if m, ok := t.maps[va]; ok {
		return m, true
	}
	for base, m := range t.maps {
		if va >= base && uint64(va-base) < m.size {
			return m, true
		}
	}
	return mapping{}, false
}

func (t *tracker) Name() string                               { return t.drv.Name() }
func (t *tracker) DeviceCount() int                           { return t.drv.DeviceCount() }
func (t *tracker) MemGetInfo(dev int) (uint64, uint64, error) { return t.drv.MemGetInfo(dev) }
func (t *tracker) Granularity(p backend.PhysicalProp, o backend.GranularityOption) (uint64, error) {
	return t.drv.Granularity(p, o)
}
func (t *tracker) ReserveAddress(size uint64) (uintptr, error) { return t.drv.ReserveAddress(size) }
func (t *tracker) ReleaseAddress(va uintptr, size uint64) error {
	return t.drv.ReleaseAddress(va, size)
}

func (t *tracker) CreatePhysical(size uint64, prop backend.PhysicalProp) (backend.Handle, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	h, err := t.drv.CreatePhysical(size, prop)
	if err != nil {
		return h, err
	}
	if err := t.born(backend.OpCreate, h); err != nil {
		return 0, err
	}
	return h, nil
}

func (t *tracker) FreePhysical(h backend.Handle) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.handles[h]
	switch {
	case l.refs == 0:
		return t.violate(Violation{Kind: FreedTwice, Op: backend.OpFree, Handle: h})
	case l.refs == 1 && l.maps > 0:
		return t.violate(Violation{Kind: FreedWhileMapped, Op: backend.OpFree, Handle: h, At: l.at})
	}
	if err := t.drv.FreePhysical(h); err != nil {
		return err
	}
	t.set(h, life{refs: l.refs - 1, maps: l.maps, at: l.at})
	return nil
}

// set records l as h's life, or forgets h when it has no reference and
// no mapping left; mu held.
func (t *tracker) set(h backend.Handle, l life) {
	if l.refs == 0 && l.maps == 0 {
		delete(t.handles, h)
		return
	}
	t.handles[h] = l
}

func (t *tracker) Map(va uintptr, size uint64, h backend.Handle) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.handles[h]
	switch {
	case l.refs == 0:
		return t.violate(Violation{Kind: MappedAfterFree, Op: backend.OpMap, Handle: h, VA: va})
	case l.maps > 0:
		return t.violate(Violation{Kind: MappedTwice, Op: backend.OpMap, Handle: h, VA: va, At: l.at})
	}
	if err := t.drv.Map(va, size, h); err != nil {
		return err
	}
	t.handles[h] = life{refs: l.refs, maps: l.maps + 1, at: va}
	t.maps[va] = mapping{h: h, size: size}
	return nil
}

func (t *tracker) Unmap(va uintptr, size uint64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.drv.Unmap(va, size); err != nil {
		return err
	}
	m, ok := t.maps[va]
	if !ok {
		return nil // a mapping the checker never saw made
	}
	delete(t.maps, va)
	if l, ok := t.handles[m.h]; ok {
		t.set(m.h, life{refs: l.refs, maps: l.maps - 1, at: l.at})
	}
	return nil
}

func (t *tracker) SetAccess(va uintptr, size uint64, desc []backend.AccessDesc) error {
	return t.drv.SetAccess(va, size, desc)
}

func (t *tracker) GetAccess(va uintptr, loc backend.Location) (backend.AccessFlags, error) {
	return t.drv.GetAccess(va, loc)
}

func (t *tracker) AddressRange(va uintptr) (uintptr, uint64, error) { return t.drv.AddressRange(va) }

func (t *tracker) RetainHandle(va uintptr) (backend.Handle, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	h, err := t.drv.RetainHandle(va)
	if err != nil {
		return h, err
	}
	if m, ok := t.mappingAt(va); ok && m.h == h {
		l := t.handles[h] // mapped, so known
		l.refs++
		t.handles[h] = l
		return h, nil
	}
	if err := t.born(backend.OpRetain, h); err != nil {
		return 0, err
	}
	return h, nil
}

func (t *tracker) HandleProperties(h backend.Handle) (backend.PhysicalProp, uint64, error) {
	return t.drv.HandleProperties(h)
}

func (t *tracker) StreamCreate(dev int) (backend.Stream, error) { return t.drv.StreamCreate(dev) }
func (t *tracker) StreamDestroy(s backend.Stream) error         { return t.drv.StreamDestroy(s) }
func (t *tracker) StreamSynchronize(s backend.Stream) error     { return t.drv.StreamSynchronize(s) }
func (t *tracker) StreamDevice(s backend.Stream) (int, error)   { return t.drv.StreamDevice(s) }
func (t *tracker) EventCreate(dev int) (backend.Event, error)   { return t.drv.EventCreate(dev) }
func (t *tracker) EventDestroy(e backend.Event) error           { return t.drv.EventDestroy(e) }
func (t *tracker) EventRecord(e backend.Event, s backend.Stream) error {
	return t.drv.EventRecord(e, s)
}
func (t *tracker) EventQuery(e backend.Event) (bool, error) { return t.drv.EventQuery(e) }
func (t *tracker) EventSynchronize(e backend.Event) error   { return t.drv.EventSynchronize(e) }

// OptionalInterfaces names the optional interfaces of package backend that
// a checked driver forwards when the wrapped driver implements them.
func OptionalInterfaces() []string { return append([]string(nil), optionalInterfaces...) }
