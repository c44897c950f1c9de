package faultproxy

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Codes that replace the protocol version in an untyped startup-phase
// message.
const (
	codeCancelRequest = 80877102
	codeSSLRequest    = 80877103
	codeGSSENCRequest = 80877104
)

// maxMessageLen bounds a message's length so that a corrupt length cannot
// make the proxy allocate without limit. Postgres itself caps messages at
// 1GB.
const maxMessageLen = 1 << 30

// readStartup reads an untyped startup-phase message: int32 length
// (including itself), then the body, whose first int32 is the protocol
// version or a request code. It returns the whole message.
func readStartup(r *bufio.Reader, buf []byte) ([]byte, error) {
	var head [4]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(head[:]))
	if n < 8 || n > 1<<16 {
		return nil, fmt.Errorf("startup message length %d is out of range", n)
	}
	buf = append(buf[:0], head[:]...)
	buf = append(buf, make([]byte, n-4)...)
	if _, err := io.ReadFull(r, buf[4:]); err != nil {
		return nil, err
	}
	return buf, nil
}

func startupCode(msg []byte) uint32 { return binary.BigEndian.Uint32(msg[4:8]) }

// readMessage reads a typed message: a type byte, an int32 length (including
// itself but not the type), then the body. It returns the whole message,
// ready to forward, reusing buf.
func readMessage(r *bufio.Reader, buf []byte) ([]byte, error) {
	var head [5]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(head[1:]))
	if n < 4 || n > maxMessageLen {
		return nil, fmt.Errorf("message %q length %d is out of range", head[0], n)
	}
	if cap(buf) < 1+n {
		buf = make([]byte, 1+n)
	}
	buf = buf[:1+n]
	copy(buf, head[:])
	if _, err := io.ReadFull(r, buf[5:]); err != nil {
		return nil, err
	}
	return buf, nil
}

// cstrings splits the start of a message body into n NUL-terminated strings.
func cstrings(body []byte, n int) ([]string, error) {
	out := make([]string, 0, n)
	for range n {
		i := bytes.IndexByte(body, 0)
		if i < 0 {
			return nil, errors.New("string is not NUL-terminated")
		}
		out = append(out, string(body[:i]))
		body = body[i+1:]
	}
	return out, nil
}

// isCommit reports whether query is exactly one statement that commits the
// current transaction. COMMIT PREPARED is not one: it finishes a two-phase
// transaction from outside it.
func isCommit(query string) bool {
	q := strings.TrimSpace(query)
	for strings.HasSuffix(q, ";") {
		q = strings.TrimSpace(strings.TrimSuffix(q, ";"))
	}
	if strings.Contains(q, ";") {
		return false
	}
	switch strings.ToLower(strings.Join(strings.Fields(q), " ")) {
	case "commit", "commit work", "commit transaction", "end", "end work", "end transaction":
		return true
	}
	return false
}
