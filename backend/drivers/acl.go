package drivers

import (
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/acl"
)

func init() { registry["acl"] = openACL }

func openACL(o Options) (backend.Driver, error) {
	var opts []acl.Option
	if o.Library != "" {
		opts = append(opts, acl.WithLibrary(o.Library))
	}
	if o.Visible != nil {
		opts = append(opts, acl.WithDevices(o.Visible...))
	}
	d, err := acl.Open(opts...)
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return d, nil
}
