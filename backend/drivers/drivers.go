// Package drivers opens a backend.Driver by name, for programs that let the
// user choose one (the CLI's --backend flag, the VMMALLOC_CONF backend key):
//
//	d, err := drivers.Open("cuda", drivers.Options{})
//
// The names are "emulated" (backend/emulated, always available), "cuda"
// (backend/cuda: the NVIDIA driver library, loaded at run time) and "acl"
// (backend/acl: the Ascend runtime library, loaded at run time). "native",
// PyTorch's value of its backend key, means the
// program's default, which is DefaultName. Every driver returned also
// implements io.Closer; Close it when done.
package drivers

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// DefaultName is the backend "native" and "" stand for.
const DefaultName = "emulated"

// Options are what a user may say about the backend; each backend reads the
// fields that concern it and ignores the rest.
type Options struct {
	// Devices is the number of emulated devices (emulated; default 1).
	Devices int
	// Capacity is the memory of each emulated device in bytes (emulated;
	// default 80 GiB).
	Capacity uint64
	// RealMemory backs emulated device memory with host memory, so that it
	// holds data (emulated).
	RealMemory bool
	// Library overrides the vendor library's path (cuda, acl).
	Library string
	// Visible lists the device ordinals to use, in order (cuda, acl;
	// default all).
	Visible []int
}

// ErrUnknown is wrapped by Open's error for a name no backend has.
var ErrUnknown = errors.New("unknown backend")

// opener opens one backend.
type opener func(o Options) (backend.Driver, error)

// registry maps each backend name to its opener. This is the one place a
// new backend is added; backends that build only on some systems register
// from a file with the matching build constraint (cuda.go: unix).
var registry = map[string]opener{
	"emulated": openEmulated,
}

// Names lists the backend names Open accepts, sorted ("native" aside).
func Names() []string {
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Open opens the backend called name. An unknown name is an error wrapping
// ErrUnknown and naming the choices; a backend that cannot start (no
// library, no device) returns its own error, wrapping
// backend.ErrUnavailable.
func Open(name string, o Options) (backend.Driver, error) {
	if name == "" || name == "native" {
		name = DefaultName
	}
	open, ok := registry[name]
	if !ok {
		return nil, fmt.Errorf("drivers: %w %q (want %s, or native)", ErrUnknown, name, strings.Join(Names(), ", "))
	}
	return open(o)
}

func openEmulated(o Options) (backend.Driver, error) {
	var opts []emulated.Option
	if o.Devices != 0 {
		opts = append(opts, emulated.WithDevices(o.Devices))
	}
	if o.Capacity != 0 {
		opts = append(opts, emulated.WithCapacity(o.Capacity))
	}
	if o.RealMemory {
		opts = append(opts, emulated.WithRealMemory())
	}
	return emulated.New(opts...)
}

// Close closes d if it implements io.Closer.
func Close(d backend.Driver) error {
	if c, ok := d.(io.Closer); ok {
		return c.Close()
	}
	return nil
}
