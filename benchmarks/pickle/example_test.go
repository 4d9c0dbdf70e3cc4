package pickle_test

import (
	"errors"
	"fmt"

	"github.com/vmmalloc/vmmalloc/benchmarks/pickle"
)

func ExampleDecode() {
	// pickle.dumps({'action': 'alloc', 'addr': 4096, 'size': 512, 'frames': []}, protocol=4)
	data := []byte("\x80\x04\x955\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x06action\x94\x8c\x05alloc\x94\x8c\x04addr\x94M\x00\x10\x8c\x04size\x94M\x00\x02\x8c\x06frames\x94]\x94u.")
	v, err := pickle.Decode(data)
	if err != nil {
		fmt.Println(err)
		return
	}
	m := v.(map[string]any)
	fmt.Println(m["action"], m["addr"].(int64), m["size"].(int64), len(m["frames"].([]any)))
	// Output: alloc 4096 512 0
}

func ExampleDecode_refusesCode() {
	// pickle.dumps(collections.OrderedDict(a=1), protocol=4) names a class.
	data := []byte("\x80\x04\x95)\x00\x00\x00\x00\x00\x00\x00\x8c\x0bcollections\x94\x8c\x0bOrderedDict\x94\x93\x94)R\x94\x8c\x01a\x94K\x01s.")
	_, err := pickle.Decode(data)
	fmt.Println(errors.Is(err, pickle.ErrForbidden))
	fmt.Println(err)
	// Output:
	// true
	// pickle: forbidden opcode STACK_GLOBAL (0x93) at offset 39: refusing to load code or objects (only plain data is accepted)
}
