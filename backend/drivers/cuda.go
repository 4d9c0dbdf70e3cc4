//go:build unix

package drivers

import (
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/cuda"
)

func init() { registry["cuda"] = openCUDA }

func openCUDA(o Options) (backend.Driver, error) {
	var opts []cuda.Option
	if o.Library != "" {
		opts = append(opts, cuda.WithLibrary(o.Library))
	}
	if o.Visible != nil {
		opts = append(opts, cuda.WithDevices(o.Visible...))
	}
	d, err := cuda.Open(opts...)
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return d, nil
}
