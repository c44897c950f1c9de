package idemgrpc

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
)

// FingerprintFunc digests a call for Key.Fingerprint: the same key sent with a different
// fingerprint is refused (FailedPrecondition) instead of being answered with another call's
// response. It gets the full method name and the decoded request, which it must not modify.
//
//	// Fingerprint only the fields that identify the operation, not a client timestamp.
//	cfg.Fingerprint = func(method string, req proto.Message) ([]byte, error) {
//		r := req.(*bankpb.TransferRequest)
//		return idem.Fingerprint(method, r.From, r.To, strconv.FormatInt(r.Amount, 10)), nil
//	}
type FingerprintFunc func(fullMethod string, req proto.Message) ([]byte, error)

// DefaultFingerprint digests the full method name and the deterministic protobuf encoding of
// the request, in which map entries are ordered by key. Two calls that decode to equal requests
// therefore match, however the client ordered its map entries; a field the server does not know
// is kept, and counts.
//
// Deterministic encoding is stable for one build of the server, not a canonical form across
// protobuf versions or languages: a retry that straddles a deploy which changes the protobuf
// library may be refused as a different request. It never makes two different requests match.
//
//	fp, err := idemgrpc.DefaultFingerprint("/bank.v1.Bank/Transfer", req)
func DefaultFingerprint(fullMethod string, req proto.Message) ([]byte, error) {
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("idemgrpc: error encoding the request of %s for its fingerprint: %w", fullMethod, err)
	}
	return idem.Fingerprint(fullMethod, string(body)), nil
}
