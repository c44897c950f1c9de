package idemgrpc

import (
	"errors"
	"fmt"
	"strings"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// storedReply is what the interceptor stores under a key and replays: the response message, or
// the error the handler answered with, and the metadata it set. Byte fields round-trip through
// idem's JSON as base64, so binary ("-bin") metadata and any message survive intact; a JSON
// string would replace invalid UTF-8.
type storedReply struct {
	// Type is the full name of the response message type; empty for an error.
	Type string `json:"type,omitempty"`
	// Message is the response, in deterministic protobuf encoding.
	Message []byte `json:"message,omitempty"`
	// Status is the handler's error as a google.rpc.Status (code, message and details).
	Status  []byte  `json:"status,omitempty"`
	Header  mdBytes `json:"header,omitempty"`
	Trailer mdBytes `json:"trailer,omitempty"`
}

// mdBytes is metadata with byte values, see storedReply.
type mdBytes map[string][][]byte

var deterministic = proto.MarshalOptions{Deterministic: true}

// answerError is an error the interceptor answers with when it refuses to store the handler's
// answer; returned from the function given to idem.Do, it rolls the transaction back.
type answerError struct {
	code   codes.Code
	reason string
	msg    string
}

func (e *answerError) Error() string { return "idemgrpc: " + e.msg }

// errNotStored rolls back a handler's answer that is not to be stored; the caller gets it as
// the handler gave it.
var errNotStored = errors.New("idemgrpc: the handler's answer is not to be stored")

// storable encodes o for storing, or says why it cannot be stored.
func (s *settings) storable(m *method, o *outcome) (storedReply, error) {
	var (
		out storedReply
		err error
	)
	if o.err != nil {
		st := status.Convert(o.err)
		if neverStored(st.Code()) || !s.Store(st.Code()) {
			return storedReply{}, errNotStored
		}
		if out.Status, err = deterministic.Marshal(st.Proto()); err != nil {
			return storedReply{}, &answerError{codes.Internal, ReasonMisconfigured, fmt.Sprintf("the handler's error cannot be encoded for storing (%v); nothing was committed", err)}
		}
	} else {
		if o.reply == nil || !o.reply.ProtoReflect().IsValid() {
			return storedReply{}, &answerError{codes.Internal, ReasonMisconfigured, "the handler returned neither a response nor an error; nothing was committed"}
		}
		got, want := o.reply.ProtoReflect().Descriptor().FullName(), m.reply.Descriptor().FullName()
		if got != want {
			return storedReply{}, &answerError{codes.Internal, ReasonMisconfigured, fmt.Sprintf("the handler returned a %s where %s returns %s; nothing was committed", got, m.name, want)}
		}
		out.Type = string(got)
		if out.Message, err = deterministic.Marshal(o.reply); err != nil {
			return storedReply{}, &answerError{codes.Internal, ReasonMisconfigured, fmt.Sprintf("the handler's response cannot be encoded (%v); nothing was committed", err)}
		}
	}
	out.Header = s.storableMetadata(o.header)
	out.Trailer = s.storableMetadata(o.trailer)
	if n := out.size(); n > s.MaxResponseBytes {
		return storedReply{}, &answerError{codes.Internal, ReasonResponseTooLarge, fmt.Sprintf("the response is %d bytes, more than the %d this server stores under an idempotency key; nothing was committed", n, s.MaxResponseBytes)}
	}
	return out, nil
}

func (r *storedReply) size() int {
	n := len(r.Type) + len(r.Message) + len(r.Status)
	for _, md := range []mdBytes{r.Header, r.Trailer} {
		for k, vs := range md {
			for _, v := range vs {
				n += len(k) + len(v)
			}
		}
	}
	return n
}

// storableMetadata is the part of md that is stored: the end-to-end metadata the handler set.
func (s *settings) storableMetadata(md metadata.MD) mdBytes {
	var out mdBytes
	for k, vs := range md {
		k = strings.ToLower(k)
		if s.dropMetadata(k) {
			continue
		}
		if out == nil {
			out = make(mdBytes, len(md))
		}
		for _, v := range vs {
			out[k] = append(out[k], []byte(v))
		}
	}
	return out
}

func (m mdBytes) metadata() metadata.MD {
	md := make(metadata.MD, len(m)+1)
	for k, vs := range m {
		for _, v := range vs {
			md[k] = append(md[k], string(v))
		}
	}
	return md
}

// rebuild turns a stored reply back into what the handler answered: a message of the method's
// response type, or the status of its error, details included. Both are decoded from the stored
// bytes, on the first answer as on every replay, so every caller gets the same answer.
func rebuild(m *method, r storedReply) (proto.Message, *spb.Status, error) {
	if r.Status != nil {
		sp := &spb.Status{}
		if err := proto.Unmarshal(r.Status, sp); err != nil {
			return nil, nil, fmt.Errorf("error decoding the stored status: %w", err)
		}
		return nil, sp, nil
	}
	if want := string(m.reply.Descriptor().FullName()); r.Type != want {
		return nil, nil, fmt.Errorf("the stored response is a %s, but %s now returns %s (did the method change?)", r.Type, m.name, want)
	}
	reply := m.reply.New().Interface()
	if err := proto.Unmarshal(r.Message, reply); err != nil {
		return nil, nil, fmt.Errorf("error decoding the stored %s: %w", r.Type, err)
	}
	return reply, nil, nil
}
