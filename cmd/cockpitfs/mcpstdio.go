package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// stdioTransport is the SDK's stdio transport behind a filter of stdin's lines. The SDK decodes
// stdin as one JSON stream and ends the session at the first line it cannot decode — and with the
// session, every holder the agent's claims made. A line that is not one JSON-RPC message (nor, where
// the protocol still has them, a batch of them) is answered here with a JSON-RPC error, id null,
// as the specification has it, and the session goes on.
type stdioTransport struct{}

// maxLine bounds one line: the SDK's own bound on one frame.
const maxLine = mcp.DefaultMaxLineLength

func (stdioTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	fromFilter, toSDK := io.Pipe()
	out := &lineWriter{w: os.Stdout}
	go filterLines(bufio.NewReaderSize(os.Stdin, 64<<10), toSDK, out)
	return (&mcp.IOTransport{Reader: fromFilter, Writer: out}).Connect(ctx)
}

// lineWriter writes each line in one piece: the SDK's answers and the filter's share stdout.
type lineWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lineWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (*lineWriter) Close() error { return nil }

// filterLines passes each whole message line of in to sdk and answers every other one on out,
// until in ends (the session's end, as for the SDK's own transport) or the SDK stops reading.
func filterLines(in *bufio.Reader, sdk *io.PipeWriter, out io.Writer) {
	batches := true // until an initialize asks for a protocol without them
	for {
		line, tooLong, err := readLine(in)
		if code, why := judgeLine(line, tooLong, &batches); code != 0 {
			answer, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": nil, "error": map[string]any{"code": code, "message": why}})
			if _, werr := out.Write(append(answer, '\n')); werr != nil {
				sdk.CloseWithError(werr)
				return
			}
		} else if len(line) > 0 {
			if _, werr := sdk.Write(append(line, '\n')); werr != nil {
				return // the session ended
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
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

// judgeLine is the JSON-RPC error a line gets instead of reaching the SDK (0: none; a blank line
// is skipped). It notes whether the protocol an initialize asks for still has batches (the two
// before 2025-06-18): under any other the SDK ends the session at a batch.
func judgeLine(line []byte, tooLong bool, batches *bool) (int, string) {
	line = bytes.TrimSpace(line)
	switch {
	case tooLong:
		return jsonrpc.CodeInvalidRequest, "Invalid Request: a message is at most 16 MiB"
	case len(line) == 0:
		return 0, ""
	case !json.Valid(line):
		return jsonrpc.CodeParseError, "Parse error: the line is not one JSON value"
	case line[0] == '[':
		var raws []json.RawMessage
		if err := json.Unmarshal(line, &raws); err != nil || len(raws) == 0 || !*batches {
			return jsonrpc.CodeInvalidRequest, "Invalid Request: not a batch this protocol version takes"
		}
		for _, raw := range raws {
			if _, err := jsonrpc.DecodeMessage(raw); err != nil {
				return jsonrpc.CodeInvalidRequest, "Invalid Request: a batch's member is not a JSON-RPC 2.0 message"
			}
		}
		return 0, ""
	}
	msg, err := jsonrpc.DecodeMessage(line)
	if err != nil {
		return jsonrpc.CodeInvalidRequest, "Invalid Request: not a JSON-RPC 2.0 message"
	}
	if req, ok := msg.(*jsonrpc.Request); ok && req.Method == "initialize" {
		var params struct {
			ProtocolVersion string `json:"protocolVersion"`
		}
		if json.Unmarshal(req.Params, &params) == nil {
			*batches = params.ProtocolVersion == "2024-11-05" || params.ProtocolVersion == "2025-03-26"
		}
	}
	return 0, ""
}
