package idemgrpc

import (
	"errors"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// recordingStream is the grpc.ServerTransportStream a guarded handler sees, so that
// grpc.SetHeader, grpc.SendHeader and grpc.SetTrailer record metadata instead of sending it.
// Nothing reaches the client until the transaction has committed (or rolled back), which is what
// makes running the handler again on a serialization failure safe: each attempt gets a fresh
// recorder. SendHeader only marks the header as final, as it would be once sent.
type recordingStream struct {
	method string

	mu         sync.Mutex
	header     metadata.MD
	trailer    metadata.MD
	headerSent bool
}

var _ grpc.ServerTransportStream = (*recordingStream)(nil)

// errHeaderSent mirrors what gRPC answers a SetHeader after the header has gone out.
var errHeaderSent = errors.New("idemgrpc: SendHeader was already called; the header cannot be changed")

func (s *recordingStream) Method() string { return s.method }

func (s *recordingStream) SetHeader(md metadata.MD) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.headerSent {
		return errHeaderSent
	}
	s.header = join(s.header, md)
	return nil
}

func (s *recordingStream) SendHeader(md metadata.MD) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.headerSent {
		return errHeaderSent
	}
	s.header = join(s.header, md)
	s.headerSent = true
	return nil
}

func (s *recordingStream) SetTrailer(md metadata.MD) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.trailer = join(s.trailer, md)
	return nil
}

// recorded returns copies of what the handler set.
func (s *recordingStream) recorded() (header, trailer metadata.MD) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.header.Copy(), s.trailer.Copy()
}

// join adds md to dst with keys in lower case, as gRPC sends them.
func join(dst, md metadata.MD) metadata.MD {
	if len(md) == 0 {
		return dst
	}
	if dst == nil {
		dst = make(metadata.MD, len(md))
	}
	for k, vs := range md {
		k = strings.ToLower(k)
		dst[k] = append(dst[k], vs...)
	}
	return dst
}
