package ipc_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator/ipc"
)

func validDescriptor() ipc.Descriptor {
	return ipc.Descriptor{Device: 1, Pid: 42, Size: 5 << 20, Offset: 1 << 20, Handles: []ipc.HandleDesc{
		{Shareable: 1<<32 + 1, Size: 2 << 20, Offset: 0},
		{Shareable: 1<<32 + 2, Size: 2 << 20, Offset: 2 << 20},
		{Shareable: 1<<32 + 3, Size: 2 << 20, Offset: 4 << 20},
	}}
}

func TestDescriptorEncodings(t *testing.T) {
	d := validDescriptor()
	b, err := d.MarshalBinary()
	require.NoError(t, err)
	assert.Len(t, b, 6+2+4+4+8+8+4+3*24)
	var got ipc.Descriptor
	require.NoError(t, got.UnmarshalBinary(b))
	assert.Equal(t, d, got)

	j, err := json.Marshal(d)
	require.NoError(t, err)
	got = ipc.Descriptor{}
	require.NoError(t, json.Unmarshal(j, &got))
	assert.Equal(t, d, got)
}

func TestDescriptorInvalid(t *testing.T) {
	rows := []struct {
		name string
		mod  func(d *ipc.Descriptor)
	}{
		{"no handles", func(d *ipc.Descriptor) { d.Handles = nil }},
		{"negative device", func(d *ipc.Descriptor) { d.Device = -1 }},
		{"size 0", func(d *ipc.Descriptor) { d.Size = 0 }},
		{"handle of size 0", func(d *ipc.Descriptor) { d.Handles[1].Size = 0 }},
		{"gap between handles", func(d *ipc.Descriptor) { d.Handles[2].Offset += 4096 }},
		{"offset past the first handle", func(d *ipc.Descriptor) { d.Offset = 2 << 20; d.Size = 1 }},
		{"bytes past the handles", func(d *ipc.Descriptor) { d.Size = 6 << 20 }},
		{"last handle unused", func(d *ipc.Descriptor) { d.Size = 1 << 20 }},
		{"offset overflow", func(d *ipc.Descriptor) { d.Size = ^uint64(0) }},
		{"sizes overflow", func(d *ipc.Descriptor) { d.Handles[2].Size = ^uint64(0) - 1 }},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			d := validDescriptor()
			r.mod(&d)
			require.ErrorIs(t, d.Validate(), ipc.ErrBadDescriptor)
			_, err := d.MarshalBinary()
			require.ErrorIs(t, err, ipc.ErrBadDescriptor)
			j, err := json.Marshal(struct {
				ipc.Descriptor
			}{d})
			require.NoError(t, err)
			keep := validDescriptor()
			require.ErrorIs(t, json.Unmarshal(j, &keep), ipc.ErrBadDescriptor)
			assert.Equal(t, validDescriptor(), keep, "a failed decode changed the descriptor")
		})
	}
	good, err := validDescriptor().MarshalBinary()
	require.NoError(t, err)
	for _, b := range [][]byte{nil, good[:len(good)-1], append([]byte("XXXXXX"), good[6:]...), append(good, 0)} {
		keep := validDescriptor()
		require.ErrorIs(t, keep.UnmarshalBinary(b), ipc.ErrBadDescriptor)
		assert.Equal(t, validDescriptor(), keep)
	}
}

// FuzzDescriptor decodes hostile bytes: every failure is ErrBadDescriptor,
// nothing panics, and whatever decodes re-encodes to the same bytes.
func FuzzDescriptor(f *testing.F) {
	good, err := validDescriptor().MarshalBinary()
	require.NoError(f, err)
	f.Add(good)
	f.Add(good[:40])
	f.Add([]byte(`{"device":0,"size":1,"offset":0,"handles":[{"shareable":1,"size":1,"offset":0}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var d ipc.Descriptor
		if err := d.UnmarshalBinary(b); err != nil {
			require.ErrorIs(t, err, ipc.ErrBadDescriptor)
			require.Equal(t, ipc.Descriptor{}, d)
		} else {
			require.NoError(t, d.Validate())
			again, err := d.MarshalBinary()
			require.NoError(t, err)
			require.Equal(t, b, again)
		}
		var j ipc.Descriptor
		if err := json.Unmarshal(b, &j); err == nil {
			require.NoError(t, j.Validate())
		}
	})
}
