package backend

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestErrorKindsAndText(t *testing.T) {
	cases := []struct {
		err  *Error
		kind error
		text string
	}{
		{Errorf(OpMap, ErrInvalidArgument, "R6", "size %d is not the handle's %d", 1, 2), ErrInvalidArgument,
			"MapMem: invalid argument [R6]: size 1 is not the handle's 2"},
		{&Error{Op: OpCreate, Kind: ErrOutOfMemory, Code: 207001}, ErrOutOfMemory,
			"MallocPhysical: out of memory (code 207001)"},
		{Errorf(OpImport, ErrNotPermitted, "R16", "pid %d not whitelisted", 7), ErrNotPermitted,
			"MemImportFromShareableHandle: not permitted [R16]: pid 7 not whitelisted"},
	}
	for _, c := range cases {
		assert.Equal(t, c.text, c.err.Error())
		wrapped := fmt.Errorf("segment: %w", c.err)
		assert.ErrorIs(t, wrapped, c.kind)
		var be *Error
		assert.True(t, errors.As(wrapped, &be))
		assert.Equal(t, c.err.Op, be.Op)
		for _, other := range []error{ErrOutOfMemory, ErrInvalidArgument, ErrNotSupported, ErrNotPermitted, ErrUnavailable} {
			assert.Equal(t, other == c.kind, errors.Is(c.err, other))
		}
	}
}

func TestNames(t *testing.T) {
	for op := Op(0); op < NumOps; op++ {
		assert.NotEmpty(t, op.String())
		assert.NotContains(t, op.String(), "Op(")
	}
	assert.Equal(t, "Op(99)", Op(99).String())
	assert.Equal(t, "huge1g", PageHuge1G.String())
	assert.Equal(t, "PageAttr(9)", PageAttr(9).String())
	assert.Equal(t, "host", LocationHost.String())
	assert.Equal(t, "LocationType(5)", LocationType(5).String())
	assert.Equal(t, PhysicalProp{Location: Location{Type: LocationDevice, ID: 3}, Attr: PageHuge}, DeviceProp(3))
}
