package protocol

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
)

// refusal is the response for err.
func refusal(err error) Response {
	code := Code(err)
	msg := err.Error()
	if code == "internal" {
		msg = ErrInternal.Error() // a host's error text stays on the host
	}
	return Response{OK: false, Error: msg, Code: code}
}

// handle decodes and answers one request. hangUp is true when the
// connection should close after the response: the await that parked.
func (s *Server) handle(ctx context.Context, line []byte) (resp Response, hangUp bool) {
	req, err := decodeRequest(line)
	if err != nil {
		return refusal(err), false
	}
	if req.Op == OpHello && req.Protocol != "" && req.Protocol != Version {
		return refusal(fmt.Errorf("%w: %q (this daemon speaks %q)", ErrUnsupported, req.Protocol, Version)), false
	}

	s.hmu.Lock()
	defer s.hmu.Unlock()
	if s.parked {
		return refusal(ErrParked), true
	}
	h := s.handler
	switch req.Op {
	case OpHello:
		hello, err := h.Hello(ctx)
		if err != nil {
			return refusal(err), false
		}
		return Response{OK: true, Protocol: Version, Run: hello.Run, Interval: &hello.Interval}, false
	case OpAppend:
		data := []byte(req.Data)
		if req.Encoding == EncodingBase64 {
			if data, err = base64.StdEncoding.DecodeString(req.Data); err != nil {
				return refusal(fmt.Errorf("%w: data: %v", ErrBadRequest, err)), false
			}
		}
		size, err := h.Append(ctx, data)
		if err != nil {
			return refusal(err), false
		}
		return Response{OK: true, Size: &size}, false
	case OpDispatch:
		if err := h.Dispatch(ctx, Call{ID: req.ID, Kind: req.Kind, Payload: req.Payload}); err != nil {
			return refusal(err), false
		}
		return Response{OK: true}, false
	case OpAwait:
		parking, err := h.Await(ctx, req.IDs)
		if err != nil {
			return refusal(err), false
		}
		s.parked = parking
		return Response{OK: true, Parking: &parking}, parking
	case OpResults:
		rs, err := h.Results(ctx)
		if err != nil {
			return refusal(err), false
		}
		if rs == nil {
			rs = []Result{}
		}
		for i := range rs {
			rs[i].Payload = orNull(rs[i].Payload)
		}
		return Response{OK: true, Results: rs}, false
	case OpResult:
		r, ok, err := h.Result(ctx, req.ID)
		if err != nil {
			return refusal(err), false
		}
		resp := Response{OK: true, Ready: &ok}
		if ok {
			r.Payload = orNull(r.Payload)
			resp.Result = &r
		}
		return resp, false
	}
	panic("unreachable: decodeRequest admits only known ops")
}

// decodeRequest parses and validates one request line.
func decodeRequest(line []byte) (Request, error) {
	var req Request
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return req, fmt.Errorf("%w: more than one JSON value on the line", ErrBadRequest)
	}
	switch req.Op {
	case OpHello, OpAppend, OpDispatch, OpAwait, OpResults, OpResult:
	case "":
		return req, fmt.Errorf("%w: no op", ErrBadRequest)
	default:
		return req, fmt.Errorf("%w: %q", ErrUnknownOp, req.Op)
	}
	if f := req.stray(); f != "" {
		return req, fmt.Errorf("%w: op %s takes no %q", ErrBadRequest, req.Op, f)
	}
	switch req.Op {
	case OpAppend:
		if req.Encoding != EncodingText && req.Encoding != EncodingBase64 {
			return req, fmt.Errorf("%w: encoding %q", ErrBadRequest, req.Encoding)
		}
	case OpDispatch:
		if err := checkID("id", req.ID); err != nil {
			return req, err
		}
		if err := checkID("kind", req.Kind); err != nil {
			return req, err
		}
		if len(req.Payload) > 0 {
			var b bytes.Buffer
			if err := json.Compact(&b, req.Payload); err != nil {
				return req, fmt.Errorf("%w: payload: %v", ErrBadRequest, err)
			}
			req.Payload = b.Bytes()
		}
		req.Payload = orNull(req.Payload)
	case OpResult:
		if err := checkID("id", req.ID); err != nil {
			return req, err
		}
	case OpAwait:
		if len(req.IDs) == 0 || len(req.IDs) > MaxIDs {
			return req, fmt.Errorf("%w: await names %d ids (1 to %d)", ErrBadRequest, len(req.IDs), MaxIDs)
		}
		seen := make(map[string]bool, len(req.IDs))
		for _, id := range req.IDs {
			if err := checkID("id", id); err != nil {
				return req, err
			}
			if seen[id] {
				return req, fmt.Errorf("%w: id %q named twice", ErrBadRequest, id)
			}
			seen[id] = true
		}
	}
	return req, nil
}

// orNull is p, or the JSON null for an absent payload.
func orNull(p json.RawMessage) json.RawMessage {
	if len(p) == 0 {
		return json.RawMessage("null")
	}
	return p
}
