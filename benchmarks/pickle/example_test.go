package pickle_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

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

func ExampleDecode_sharedKey() {
	// 85 bytes: {t40: None} where t0 = None and t(i+1) = (ti, ti), built by
	// DUP+TUPLE2. The key has 2^40 leaves but only 40 distinct tuples, and
	// decoding costs one step per distinct tuple.
	data := []byte("}N" + strings.Repeat("2\x86", 40) + "Ns.")
	v, err := pickle.Decode(data)
	if err != nil {
		fmt.Println(err)
		return
	}
	d := v.(*pickle.Dict)
	_, found := d.Get(d.Items[0].Key)
	fmt.Println(len(data), d.Len(), found)
	// Output: 85 1 true
}

func ExampleDecode_budget() {
	// A 1 MiB str key set 100 times: a Go map hashes it whole each time,
	// 100 MiB of hashing for 1 MiB of input, past the budget of
	// KeyWorkPerByte bytes per input byte plus KeyWorkBase.
	key := strings.Repeat("k", 1<<20)
	data := []byte("}X" + string(binary.LittleEndian.AppendUint32(nil, uint32(len(key)))) + key +
		"\x940" + strings.Repeat("h\x00Ns", 100) + ".")
	_, err := pickle.Decode(data)
	fmt.Println(errors.Is(err, pickle.ErrBudget))
	// Output: true
}
