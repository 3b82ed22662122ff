package wasmhost

import "errors"

// wasmGuest calls the callbacks of a VM's compiled module (one pointer:
// made into a Guest without an allocation).
type wasmGuest struct{ vm *VM }

func (g wasmGuest) OnRequestHeaders(id, n uint32, end bool) (uint32, error) {
	r, err := g.vm.call(g.vm.fn.requestHeaders, uint64(id), uint64(n), b2u(end))
	return uint32(r), err
}

func (g wasmGuest) OnResponseHeaders(id, n uint32, end bool) (uint32, error) {
	r, err := g.vm.call(g.vm.fn.responseHeaders, uint64(id), uint64(n), b2u(end))
	return uint32(r), err
}

func (g wasmGuest) OnRequestBody(id, size uint32, end bool) (uint32, error) {
	if g.vm.fn.requestBody == nil {
		return 0, nil // not exported: Envoy does not call it
	}
	r, err := g.vm.call(g.vm.fn.requestBody, uint64(id), uint64(size), b2u(end))
	return uint32(r), err
}

func (g wasmGuest) OnResponseBody(id, size uint32, end bool) (uint32, error) {
	if g.vm.fn.responseBody == nil {
		return 0, nil // not exported: Envoy does not call it
	}
	r, err := g.vm.call(g.vm.fn.responseBody, uint64(id), uint64(size), b2u(end))
	return uint32(r), err
}

func (g wasmGuest) OnHttpCallResponse(rootID, token, numHeaders, bodySize uint32) error {
	_, err := g.vm.call(g.vm.fn.callResponse, uint64(rootID), uint64(token), uint64(numHeaders), uint64(bodySize), 0)
	return err
}

// OnStreamEnd runs all three callbacks, whatever one of them answers.
func (g wasmGuest) OnStreamEnd(id uint32) error {
	_, err1 := g.vm.call(g.vm.fn.done, uint64(id))
	_, err2 := g.vm.call(g.vm.fn.log, uint64(id))
	_, err3 := g.vm.call(g.vm.fn.del, uint64(id))
	if err1 == nil && err2 == nil && err3 == nil {
		return nil
	}
	return errors.Join(err1, err2, err3)
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}
