package emulated

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"time"

	"github.com/vmmalloc/vmmalloc/backend"
)

// A CostProfile is a CostModel with a name and the source of its figures:
// a driver measured on a device, or the guesses the emulator used before.
//
// Four profiles are built in (NamedCostProfile):
//
//   - "a100" (the default): an A100 with 2 MB handles as kvcached's
//     benchmarks/bench_vmm measured it (ovg-project/kvcached): create 193 µs,
//     map 1.45 µs, set-access 36 µs, unmap 25.6 µs, reserve 19 µs. Handle
//     creation dominates; mapping is nearly free.
//   - "gpu2": the same benchmark on a second GPU it does not name: create
//     7.6 µs, map 1.05 µs, set-access 20.8 µs, unmap 11.5 µs.
//   - "h200": what backend/cuda/gpucheck.sh measured on one NVIDIA H200
//     (driver 580.159.04, 2 MiB granule; docs/results.md "Driver call
//     costs"), fitted per call + per GiB: create 15.9 µs + 138.6 µs/GiB,
//     map 2.5 µs, set-access 32.2 µs + 121 µs/GiB, unmap 21.7 µs +
//     48 µs/GiB, free 15.4 µs + 642 µs/GiB, reserve 2.3 µs, release 1.8 µs.
//   - "legacy": LegacyCostModel, the unmeasured model of earlier figures.
//
// The A100 and second-GPU sources measured 2 MB handles only, and neither
// timed free or release: their per-GiB terms and their free, reserve (gpu2)
// and release figures are the H200's, with the per-call term chosen so that
// a 2 MiB call costs exactly what the source measured. Every primitive no
// source timed (streams, events, host memory, copies, IPC, queries) keeps
// its legacy figure in every profile.
type CostProfile struct {
	Name   string // short name ("a100"); free text in loaded files
	Source string // where the figures come from
	Model  CostModel
}

// CostProfileFormat is the format tag of a cost profile file.
const CostProfileFormat = "vmmalloc-cost-profile/1"

// DefaultCostProfile names the profile the emulator charges unless
// WithCostModel says otherwise.
const DefaultCostProfile = "a100"

// Limits of a cost profile file: it is small, and no cost exceeds an hour
// per call or per GiB (so that sums over a replay stay far from overflow).
const (
	maxProfileBytes = 1 << 20
	maxProfileCost  = time.Hour
	maxProfileText  = 4096 // bytes of Name and Source
)

// ErrBadCostProfile reports a cost profile file that cannot be used, or an
// unknown profile name.
var ErrBadCostProfile = errors.New("emulated: bad cost profile")

// CostProfileNames lists the built-in profiles, the default first.
func CostProfileNames() []string { return []string{"a100", "gpu2", "h200", "legacy"} }

// measured2MiB builds a profile from per-call figures measured at 2 MiB:
// with the per-GiB slope of each primitive, the per-call term is the
// measured figure less the slope's share of 2 MiB.
func measured2MiB(at2MiB, perGiB map[backend.Op]time.Duration) CostModel {
	m := LegacyCostModel()
	for op, g := range perGiB {
		m.PerGiB[op] = g
	}
	for op := range perGiB { // primitives with a slope but no 2 MiB figure: slope only
		if _, ok := at2MiB[op]; !ok {
			m.PerCall[op] = h200PerCall[op]
		}
	}
	for op, c := range at2MiB {
		m.PerCall[op] = c - m.PerGiB[op]*2/1024
	}
	return m
}

const us = time.Microsecond

// The H200 fit (gpucheck, per call + per GiB).
var (
	h200PerCall = map[backend.Op]time.Duration{
		backend.OpCreate:    15900 * time.Nanosecond,
		backend.OpMap:       2500 * time.Nanosecond,
		backend.OpSetAccess: 32200 * time.Nanosecond,
		backend.OpUnmap:     21700 * time.Nanosecond,
		backend.OpFree:      15400 * time.Nanosecond,
		backend.OpReserve:   2300 * time.Nanosecond,
		backend.OpRelease:   1800 * time.Nanosecond,
	}
	h200PerGiB = map[backend.Op]time.Duration{
		backend.OpCreate:    138600 * time.Nanosecond,
		backend.OpSetAccess: 121 * us,
		backend.OpUnmap:     48 * us,
		backend.OpFree:      642 * us,
		backend.OpMap:       0,
	}
)

// NamedCostProfile returns the built-in profile called name.
func NamedCostProfile(name string) (CostProfile, bool) {
	switch name {
	case "a100":
		m := measured2MiB(map[backend.Op]time.Duration{
			backend.OpCreate:    193 * us,
			backend.OpMap:       1450 * time.Nanosecond,
			backend.OpSetAccess: 36 * us,
			backend.OpUnmap:     25600 * time.Nanosecond,
			backend.OpFree:      h200PerCall[backend.OpFree] + h200PerGiB[backend.OpFree]*2/1024,
		}, h200PerGiB)
		m.PerCall[backend.OpReserve] = 19 * us // an 8 GB reservation
		m.PerCall[backend.OpRelease] = h200PerCall[backend.OpRelease]
		return CostProfile{Name: name, Model: m, Source: "A100, 2 MB handles, kvcached benchmarks/bench_vmm " +
			"(create, map, set-access, unmap, reserve); free, release and per-GiB terms from the h200 profile; " +
			"other primitives legacy"}, true
	case "gpu2":
		m := measured2MiB(map[backend.Op]time.Duration{
			backend.OpCreate:    7600 * time.Nanosecond,
			backend.OpMap:       1050 * time.Nanosecond,
			backend.OpSetAccess: 20800 * time.Nanosecond,
			backend.OpUnmap:     11500 * time.Nanosecond,
			backend.OpFree:      h200PerCall[backend.OpFree] + h200PerGiB[backend.OpFree]*2/1024,
		}, h200PerGiB)
		m.PerCall[backend.OpReserve] = h200PerCall[backend.OpReserve]
		m.PerCall[backend.OpRelease] = h200PerCall[backend.OpRelease]
		return CostProfile{Name: name, Model: m, Source: "a second GPU, 2 MB handles, kvcached benchmarks/bench_vmm " +
			"(create, map, set-access, unmap); free, reserve, release and per-GiB terms from the h200 profile; " +
			"other primitives legacy"}, true
	case "h200":
		m := LegacyCostModel()
		for op, c := range h200PerCall {
			m.PerCall[op] = c
		}
		for op, g := range h200PerGiB {
			m.PerGiB[op] = g
		}
		return CostProfile{Name: name, Model: m, Source: "NVIDIA H200, driver 580.159.04, 2 MiB granule, " +
			"backend/cuda/gpucheck.sh fitted per call + per GiB (VMM calls); other primitives legacy"}, true
	case "legacy":
		return CostProfile{Name: name, Model: LegacyCostModel(), Source: "unmeasured guesses (the emulator's model before measured profiles)"}, true
	}
	return CostProfile{}, false
}

// LoadCostProfile returns the built-in profile called nameOrPath, or else
// reads the profile file at that path.
func LoadCostProfile(nameOrPath string) (CostProfile, error) {
	if p, ok := NamedCostProfile(nameOrPath); ok {
		return p, nil
	}
	f, err := os.Open(nameOrPath)
	if err != nil {
		return CostProfile{}, fmt.Errorf("%w: %q is no built-in profile (%v) and cannot be read: %v",
			ErrBadCostProfile, nameOrPath, CostProfileNames(), err)
	}
	defer f.Close()
	return ReadCostProfile(f)
}

// profileFile is the JSON form of a CostProfile:
//
//	{"format": "vmmalloc-cost-profile/1", "name": "h200", "source": "...",
//	 "base": "legacy",
//	 "ops": {"MallocPhysical": {"per_call_ns": 15900, "per_gib_ns": 138600}, ...}}
//
// Ops are named as backend.Op's String names them. Base, if set, names the
// built-in profile whose figures the primitives the file does not list
// take; without it they cost nothing.
type profileFile struct {
	Format string             `json:"format"`
	Name   string             `json:"name,omitempty"`
	Source string             `json:"source,omitempty"`
	Base   string             `json:"base,omitempty"`
	Ops    map[string]opCosts `json:"ops"`
}

type opCosts struct {
	PerCallNs int64 `json:"per_call_ns"`
	PerGiBNs  int64 `json:"per_gib_ns,omitempty"`
}

// ReadCostProfile parses a cost profile file (format CostProfileFormat, at
// most 1 MiB). Unknown fields, unknown primitives, costs below zero or
// above an hour, and an unknown base are ErrBadCostProfile.
func ReadCostProfile(r io.Reader) (CostProfile, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxProfileBytes+1))
	if err != nil {
		return CostProfile{}, fmt.Errorf("%w: %v", ErrBadCostProfile, err)
	}
	if len(data) > maxProfileBytes {
		return CostProfile{}, fmt.Errorf("%w: larger than %d bytes", ErrBadCostProfile, maxProfileBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f profileFile
	if err := dec.Decode(&f); err != nil {
		return CostProfile{}, fmt.Errorf("%w: %v", ErrBadCostProfile, err)
	}
	if dec.More() {
		return CostProfile{}, fmt.Errorf("%w: data after the profile", ErrBadCostProfile)
	}
	if f.Format != CostProfileFormat {
		return CostProfile{}, fmt.Errorf("%w: format %q, want %q", ErrBadCostProfile, f.Format, CostProfileFormat)
	}
	if len(f.Name) > maxProfileText || len(f.Source) > maxProfileText {
		return CostProfile{}, fmt.Errorf("%w: name or source longer than %d bytes", ErrBadCostProfile, maxProfileText)
	}
	p := CostProfile{Name: f.Name, Source: f.Source}
	if f.Base != "" {
		b, ok := NamedCostProfile(f.Base)
		if !ok {
			return CostProfile{}, fmt.Errorf("%w: unknown base profile %q (want one of %v)", ErrBadCostProfile, f.Base, CostProfileNames())
		}
		p.Model = b.Model
	}
	for name, c := range f.Ops {
		op, ok := opByName(name)
		if !ok {
			return CostProfile{}, fmt.Errorf("%w: unknown primitive %q", ErrBadCostProfile, name)
		}
		for _, v := range []int64{c.PerCallNs, c.PerGiBNs} {
			if v < 0 || v > int64(maxProfileCost) {
				return CostProfile{}, fmt.Errorf("%w: %s: cost %d ns outside [0, %v]", ErrBadCostProfile, name, v, maxProfileCost)
			}
		}
		p.Model.PerCall[op] = time.Duration(c.PerCallNs)
		p.Model.PerGiB[op] = time.Duration(c.PerGiBNs)
	}
	return p, nil
}

// WriteCostProfile writes p as a profile file that ReadCostProfile reads
// back to p: every primitive with a cost, no base.
func WriteCostProfile(w io.Writer, p CostProfile) error {
	f := profileFile{Format: CostProfileFormat, Name: p.Name, Source: p.Source, Ops: map[string]opCosts{}}
	for op := range backend.NumOps {
		c, g := p.Model.PerCall[op], p.Model.PerGiB[op]
		if c == 0 && g == 0 {
			continue
		}
		f.Ops[op.String()] = opCosts{PerCallNs: int64(c), PerGiBNs: int64(g)}
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

func opByName(name string) (backend.Op, bool) {
	for op := range backend.NumOps {
		if op.String() == name {
			return op, true
		}
	}
	return 0, false
}

// A CostSample is one measured call: the bytes it handled and how long it
// took.
type CostSample struct {
	Bytes   uint64
	Latency time.Duration
}

// FitCost fits per call + per GiB to samples by least squares, the two
// terms held at zero or above: a fit with a negative slope is the mean
// latency per call, one with a negative intercept a line through zero.
// Samples of one size give the mean per call and no per-GiB term. It
// needs at least one sample, and latencies at or above zero.
func FitCost(samples []CostSample) (perCall, perGiB time.Duration, err error) {
	if len(samples) == 0 {
		return 0, 0, fmt.Errorf("emulated: FitCost: no samples: %w", backend.ErrInvalidArgument)
	}
	var n, sx, sy, sxx, sxy float64
	for _, s := range samples {
		if s.Latency < 0 {
			return 0, 0, fmt.Errorf("emulated: FitCost: negative latency %v: %w", s.Latency, backend.ErrInvalidArgument)
		}
		x, y := float64(s.Bytes)/float64(GiB), float64(s.Latency)
		n++
		sx += x
		sy += y
		sxx += x * x
		sxy += x * y
	}
	mean := sy / n
	den := n*sxx - sx*sx
	if den <= 1e-18*n*sxx {
		return round(mean), 0, nil
	}
	b := (n*sxy - sx*sy) / den
	a := (sy - b*sx) / n
	switch {
	case b < 0:
		return round(mean), 0, nil
	case a < 0:
		if sxx == 0 {
			return round(mean), 0, nil
		}
		return 0, round(sxy / sxx), nil
	}
	return round(a), round(b), nil
}

func round(ns float64) time.Duration {
	if ns >= float64(math.MaxInt64) {
		return math.MaxInt64
	}
	return time.Duration(math.Round(ns))
}
