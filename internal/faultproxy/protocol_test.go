package faultproxy

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestIsCommit(t *testing.T) {
	t.Parallel()

	for _, q := range []string{"commit", "COMMIT", " commit ; ", "Commit Work", "commit\n transaction;", "END", "end transaction"} {
		require.True(t, isCommit(q), q)
	}
	for _, q := range []string{"", "begin", "commit; select 1", "select 'commit'", "commit prepared 'x'", "rollback", "committed"} {
		require.False(t, isCommit(q), q)
	}
}

func TestReadMessage(t *testing.T) {
	t.Parallel()

	// A Query message followed by a Sync, as they arrive on the wire.
	wire := []byte{'Q', 0, 0, 0, 11, 'c', 'o', 'm', 'm', 'i', 't', 0, 'S', 0, 0, 0, 4}
	r := bufio.NewReader(bytes.NewReader(wire))

	msg, err := readMessage(r, nil)
	require.NoError(t, err)
	require.Equal(t, wire[:12], msg)
	ss, err := cstrings(msg[5:], 1)
	require.NoError(t, err)
	require.Equal(t, []string{"commit"}, ss)

	msg, err = readMessage(r, msg)
	require.NoError(t, err)
	require.Equal(t, wire[12:], msg)

	_, err = readMessage(bufio.NewReader(bytes.NewReader([]byte{'Q', 0, 0, 0, 3})), nil)
	require.ErrorContains(t, err, "out of range")
}

func TestDeclinesEncryption(t *testing.T) {
	t.Parallel()

	// A stand-in server: the proxy dials it for each client, and these
	// requests never reach it.
	server, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer server.Close()
	go func() {
		for {
			conn, err := server.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				_, _ = io.Copy(io.Discard, conn) // until the proxy hangs up
			}()
		}
	}()

	proxy, err := New(server.Addr().String())
	require.NoError(t, err)
	defer proxy.Close()

	for _, code := range []uint32{codeSSLRequest, codeGSSENCRequest} {
		conn, err := net.Dial("tcp", proxy.Addr())
		require.NoError(t, err)
		request := binary.BigEndian.AppendUint32([]byte{0, 0, 0, 8}, code)
		_, err = conn.Write(request)
		require.NoError(t, err)
		answer := make([]byte, 1)
		_, err = io.ReadFull(conn, answer)
		require.NoError(t, err)
		require.Equal(t, "N", string(answer))
		require.NoError(t, conn.Close())
	}
}
