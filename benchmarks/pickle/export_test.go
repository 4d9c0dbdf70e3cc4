package pickle

// What the tests in package pickle_test (real_test.go, which import
// benchmarks/trace and so cannot be in package pickle) need of the
// package's inside.

// DecodeCharged decodes data as Decode does and returns the key work it
// was charged (decoder.work) besides the value.
func DecodeCharged(data []byte) (v any, work int64, err error) {
	d := decoder{data: data, budget: KeyWorkPerByte*int64(len(data)) + KeyWorkBase}
	v, err = d.run()
	return v, d.work, err
}

// AllocatedBy and AllocBound are allocatedBy and allocBound
// (hostile_test.go).
var (
	AllocatedBy = allocatedBy
	AllocBound  = allocBound
)
