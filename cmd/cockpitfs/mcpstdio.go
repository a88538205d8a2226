package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// stdioTransport is the SDK's stdio transport behind a filter of stdin's lines. The SDK decodes
// stdin as one JSON stream and ends the session at the first line it cannot decode — and with the
// session, every holder the agent's claims made. A line that is not one JSON-RPC message (nor, where
// the protocol still has them, a batch of them) is answered here with a JSON-RPC error, as the
// specification has it, and the session goes on. And the SDK ends the session at the end of stdin
// with the requests still under way dropped, neither run to the end nor answered: here the end of
// stdin reaches it once each request read has been answered, so `printf … | cockpitfs mcp` does
// what it was sent.
type stdioTransport struct{}

// maxLine bounds one line: the SDK's own bound on one frame.
const maxLine = mcp.DefaultMaxLineLength

func (stdioTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	fromFilter, toSDK := io.Pipe()
	out := &lineWriter{w: os.Stdout, pending: map[string]bool{}}
	out.answered = sync.NewCond(&out.mu)
	go filterLines(bufio.NewReaderSize(os.Stdin, 64<<10), toSDK, out)
	return (&mcp.IOTransport{Reader: fromFilter, Writer: out}).Connect(ctx)
}

// lineWriter writes each line in one piece (the SDK's answers and the filter's share stdout), and
// keeps the ids of the requests passed to the SDK that it has yet to answer.
type lineWriter struct {
	mu       sync.Mutex
	w        io.Writer
	pending  map[string]bool
	answered *sync.Cond // signalled as pending shrinks
}

func (l *lineWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	msgs, _ := decodeLine(bytes.TrimSpace(p))
	for _, msg := range msgs {
		if r, ok := msg.(*jsonrpc.Response); ok {
			delete(l.pending, idKey(r.ID))
		}
	}
	l.answered.Broadcast()
	return l.w.Write(p)
}

func (*lineWriter) Close() error { return nil }

// track notes what msgs, passed to the SDK, leave to answer: each request with an id, less one a
// notifications/cancelled gives up (the SDK does not answer it).
func (l *lineWriter) track(msgs []jsonrpc.Message) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, msg := range msgs {
		req, ok := msg.(*jsonrpc.Request)
		switch {
		case !ok:
		case req.ID.IsValid():
			l.pending[idKey(req.ID)] = true
		case req.Method == "notifications/cancelled":
			var p struct {
				RequestID any `json:"requestId"`
			}
			if json.Unmarshal(req.Params, &p) == nil {
				if id, err := jsonrpc.MakeID(p.RequestID); err == nil {
					delete(l.pending, idKey(id))
				}
			}
		}
	}
	l.answered.Broadcast()
}

// drain waits until every request passed to the SDK is answered.
func (l *lineWriter) drain() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for len(l.pending) > 0 {
		l.answered.Wait()
	}
}

// idKey tells ids apart by type: the number 1 and the string "1" are two requests.
func idKey(id jsonrpc.ID) string { return fmt.Sprintf("%T:%v", id.Raw(), id.Raw()) }

// filterLines passes each whole message line of in to sdk and answers every other one on out,
// until in ends (the session's end, once what it asked is answered) or the SDK stops reading.
func filterLines(in *bufio.Reader, sdk *io.PipeWriter, out *lineWriter) {
	batches := true // until an initialize asks for a protocol without them
	for {
		line, tooLong, err := readLine(in)
		if msgs, code, why, id := judgeLine(line, tooLong, &batches); code != 0 {
			answer, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "error": map[string]any{"code": code, "message": why}})
			if _, werr := out.Write(append(answer, '\n')); werr != nil {
				sdk.CloseWithError(werr)
				return
			}
		} else if len(msgs) > 0 {
			out.track(msgs)
			if _, werr := sdk.Write(append(line, '\n')); werr != nil {
				return // the session ended
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				out.drain()
				err = nil
			}
			sdk.CloseWithError(err)
			return
		}
	}
}

// readLine reads one line without its newline; of one longer than maxLine it keeps nothing and
// says so.
func readLine(in *bufio.Reader) (line []byte, tooLong bool, err error) {
	for {
		piece, err := in.ReadSlice('\n')
		if !tooLong {
			if len(line)+len(piece) > maxLine+1 {
				line, tooLong = nil, true
			} else {
				line = append(line, piece...)
			}
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return bytes.TrimSuffix(line, []byte{'\n'}), tooLong, err
		}
	}
}

// decodeLine is the messages of a line, one or a batch's, and each one's text; none for anything
// else.
func decodeLine(line []byte) ([]jsonrpc.Message, []json.RawMessage) {
	raws := []json.RawMessage{line}
	if len(line) > 0 && line[0] == '[' {
		raws = nil
		if json.Unmarshal(line, &raws) != nil {
			return nil, nil
		}
	}
	msgs := make([]jsonrpc.Message, 0, len(raws))
	for _, raw := range raws {
		msg, err := jsonrpc.DecodeMessage(raw)
		if err != nil {
			return nil, nil
		}
		msgs = append(msgs, msg)
	}
	return msgs, raws
}

// judgeLine is a line's messages for the SDK (none for a blank line), or the JSON-RPC error it
// gets instead (code not 0) and the id to answer that with (nil when it cannot be told). It notes
// whether the protocol an initialize asks for still has batches (the two before 2025-06-18):
// under any other the SDK ends the session at a batch.
func judgeLine(line []byte, tooLong bool, batches *bool) (msgs []jsonrpc.Message, code int, why string, id json.RawMessage) {
	line = bytes.TrimSpace(line)
	switch {
	case tooLong:
		return nil, jsonrpc.CodeInvalidRequest, "Invalid Request: a message is at most 16 MiB", nil
	case len(line) == 0:
		return nil, 0, "", nil
	case !json.Valid(line):
		return nil, jsonrpc.CodeParseError, "Parse error: the line is not one JSON value", nil
	}
	msgs, raws := decodeLine(line)
	batch := line[0] == '['
	switch {
	case batch && (len(msgs) == 0 || !*batches):
		return nil, jsonrpc.CodeInvalidRequest, "Invalid Request: not a batch of JSON-RPC 2.0 messages this protocol version takes", nil
	case len(msgs) == 0:
		return nil, jsonrpc.CodeInvalidRequest, "Invalid Request: not a JSON-RPC 2.0 message", nil
	}
	for _, raw := range raws {
		if !integralID(raw) {
			// The SDK would answer it with another id (1.5 as 1, 1e30 as -9223372036854775808).
			var m struct {
				ID json.RawMessage `json:"id"`
			}
			if !batch {
				json.Unmarshal(raw, &m)
			}
			return nil, jsonrpc.CodeInvalidRequest, "Invalid Request: an id is a string or an integer of at most 64 bits", m.ID
		}
	}
	if req, ok := msgs[0].(*jsonrpc.Request); ok && !batch && req.Method == "initialize" {
		var params struct {
			ProtocolVersion string `json:"protocolVersion"`
		}
		if json.Unmarshal(req.Params, &params) == nil {
			*batches = params.ProtocolVersion == "2024-11-05" || params.ProtocolVersion == "2025-03-26"
		}
	}
	return msgs, 0, "", nil
}

// integralID says whether a message's id, if it is a number, is an integer an int64 holds.
func integralID(raw []byte) bool {
	var m struct {
		ID *json.Number `json:"id"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if dec.Decode(&m) != nil || m.ID == nil {
		return true // not a number (a string, null, none): the SDK's to judge
	}
	if _, err := m.ID.Int64(); err == nil {
		return true
	}
	f, err := m.ID.Float64()
	return err == nil && f == math.Trunc(f) && f >= math.MinInt64 && f < math.MaxInt64 && !math.IsInf(f, 0)
}
