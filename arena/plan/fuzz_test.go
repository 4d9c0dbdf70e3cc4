package plan_test

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"

	"github.com/vmmalloc/vmmalloc/arena/plan"
)

// decodeIntervals turns fuzz input into an alignment and intervals. The
// first byte picks the alignment (its low 6 bits the exponent; bit 6 makes
// it a non-power of two); then each interval takes 4 bytes: a size class
// (small, a multiple of 512, or near 2^64), a size, a birth and a
// lifetime (0 gives Birth == Death, which must be rejected).
func decodeIntervals(data []byte) ([]plan.Interval, uint64) {
	if len(data) == 0 {
		return nil, 1
	}
	align := uint64(1) << (data[0] & 63)
	if data[0]&64 != 0 {
		align += 2
	}
	data = data[1:]
	var ivs []plan.Interval
	for len(data) >= 4 && len(ivs) < 200 {
		var size uint64
		switch data[0] % 4 {
		case 0:
			size = uint64(data[1])
		case 1:
			size = uint64(data[1]) * 512
		case 2:
			size = uint64(data[1]) << 24
		case 3:
			size = math.MaxUint64 - uint64(data[1])<<56
		}
		birth := uint64(data[2])
		if data[0]&4 != 0 {
			birth = math.MaxUint64 - 256 + birth
		}
		death := birth + uint64(data[3]%64)
		if death < birth {
			death = math.MaxUint64
		}
		ivs = append(ivs, plan.Interval{Size: size, Birth: birth, Death: death})
		data = data[4:]
	}
	return ivs, align
}

// FuzzPack packs arbitrary intervals: Pack never panics, rejects bad input
// with a typed error, and every packing it returns passes Verify and the
// pairwise check and is no smaller than PeakLive.
func FuzzPack(f *testing.F) {
	f.Add([]byte{9, 1, 4, 0, 5, 1, 8, 2, 5, 0, 200, 1, 1})
	f.Add([]byte{0, 3, 0, 0, 2, 3, 0, 1, 2})
	f.Add([]byte{0, 2, 255, 0, 9, 2, 255, 3, 9, 2, 255, 3, 9})
	f.Add([]byte{70, 0, 1, 0, 1})
	var b []byte
	b = append(b, 9)
	for i := 0; i < 60; i++ {
		b = binary.LittleEndian.AppendUint32(b, uint32(i*2654435761))
	}
	f.Add(b)
	f.Fuzz(func(t *testing.T, data []byte) {
		ivs, align := decodeIntervals(data)
		offs, size, err := plan.Pack(ivs, align)
		valid := plan.Validate(ivs, align)
		if err != nil {
			if offs != nil || size != 0 {
				t.Fatalf("error %v with offsets %v size %d", err, offs, size)
			}
			if valid != nil {
				if err.Error() != valid.Error() {
					t.Fatalf("Pack: %v, Validate: %v", err, valid)
				}
				return
			}
			if !errors.Is(err, plan.ErrOverflow) {
				t.Fatalf("valid input rejected: %v", err)
			}
			var ie *plan.IntervalError
			if !errors.As(err, &ie) || ie.Index < 0 || ie.Index >= len(ivs) || ivs[ie.Index] != ie.Interval {
				t.Fatalf("overflow names no interval: %v", err)
			}
			return
		}
		if valid != nil {
			t.Fatalf("invalid input (%v) packed", valid)
		}
		if err := plan.Verify(ivs, offs, align, size); err != nil {
			t.Fatal(err)
		}
		if i, j, ok := bruteVerify(ivs, offs); !ok {
			t.Fatalf("intervals %d and %d overlap", i, j)
		}
		if peak := plan.PeakLive(ivs, align); size < peak {
			t.Fatalf("size %d below the peak %d", size, peak)
		}
	})
}
