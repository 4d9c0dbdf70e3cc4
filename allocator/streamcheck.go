package allocator

import (
	"errors"
	"fmt"

	"github.com/vmmalloc/vmmalloc/backend"
)

// validator validates callers' streams for this allocator's device with
// the mechanism the host allocator shares (backend.StreamValidator), so
// that both refuse a stream the driver does not know in the same words. A
// value of three words: making one costs nothing.
func (a *Allocator) validator() backend.StreamValidator {
	return backend.NewStreamValidator(a.drv, a.dev)
}

// invalidStream wraps a refusal of the validator in ErrInvalidStream; an
// error of the driver's query itself is returned as it is.
func invalidStream(err error) error {
	var se *backend.StreamError
	if errors.As(err, &se) {
		return fmt.Errorf("%w: %w", ErrInvalidStream, err)
	}
	return err
}

// knownStream reports whether stream s (0: the default stream) is in use,
// so that stream() returns it without asking the driver. mu held.
func (a *Allocator) knownStream(s backend.Stream) bool {
	if s == 0 {
		s = a.defaultS
	}
	_, ok := a.streams[s]
	return ok
}

// recheckStream asks the driver whether the stream of ss, which the
// allocator knows, still exists. One destroyed behind the allocator's back
// (or whose id now names a stream of another device) vanishes: its memory
// waits for a device synchronize, as when any other call finds it gone,
// and it is refused with ErrInvalidStream. It does not wait. If the driver
// cannot answer, its error is returned and nothing changes. mu held.
func (a *Allocator) recheckStream(ss *streamState) error {
	if _, err := a.validator().Validate(ss.stream); err != nil {
		var se *backend.StreamError
		if errors.As(err, &se) {
			a.vanish(ss)
		}
		return invalidStream(err)
	}
	return nil
}
