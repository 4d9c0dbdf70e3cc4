package plan

// FirstFitInOrder packs ivs in the given order, each interval at the
// lowest offset where it fits, through the packer's index: the mechanism
// every pass of Pack uses, exposed so tests can hold it to a model.
func FirstFitInOrder(ivs []Interval, align uint64, order []int) ([]uint64, uint64, error) {
	if err := Validate(ivs, align); err != nil {
		return nil, 0, err
	}
	if len(ivs) == 0 {
		return []uint64{}, 0, nil
	}
	p := newPacker(ivs, align)
	o := make([]int32, len(order))
	for k, i := range order {
		o[k] = int32(i)
	}
	size, bad, ok := p.greedy(o, ^uint64(0))
	if !ok {
		return nil, 0, &IntervalError{Index: int(bad), Interval: ivs[bad], Err: ErrOverflow}
	}
	return p.offsets, size, nil
}

// SetMaxIntervals lowers the most intervals Validate accepts, for a test;
// it returns a function that restores it.
func SetMaxIntervals(n int) (restore func()) {
	old := maxIntervals
	maxIntervals = n
	return func() { maxIntervals = old }
}
