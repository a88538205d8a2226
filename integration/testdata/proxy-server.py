"""A stack's dev server for the proxy's tests: python3 proxy-server.py PORT NAME.

GET /         an HTML page naming the stack and the cookies it was sent; sets cookie stack=NAME
GET /headers  the Host and X-Forwarded-* headers it was sent, as JSON
GET /stream   three lines, a flush and 0.2 s apart (a streaming response)
GET /ws       a WebSocket that echoes each text message (RFC 6455, written out: no packages)
"""
import base64, hashlib, html, http.server, json, struct, sys, time

port, name = int(sys.argv[1]), sys.argv[2]


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send(self, code, body, ctype, extra=()):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/headers":
            keys = ["Host", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Forwarded-For"]
            return self.send(200, json.dumps({k: self.headers.get(k) for k in keys}), "application/json")
        if self.path == "/stream":
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(3):
                line = ("line %d\n" % i).encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
                time.sleep(0.2)
            self.wfile.write(b"0\r\n\r\n")
            return
        if self.path == "/ws":
            return self.websocket()
        cookies = self.headers.get("Cookie") or ""
        page = '<html><body><p id="stack">%s</p><p id="cookies">%s</p></body></html>' % (
            html.escape(name), html.escape(cookies))
        self.send(200, page, "text/html", [("Set-Cookie", "stack=%s; Path=/" % name)])

    def websocket(self):
        key = self.headers.get("Sec-WebSocket-Key", "")
        accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept.decode())
        self.end_headers()
        self.wfile.flush()
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            opcode, length = head[0] & 0x0F, head[1] & 0x7F
            if length == 126:
                length = struct.unpack(">H", self.rfile.read(2))[0]
            elif length == 127:
                length = struct.unpack(">Q", self.rfile.read(8))[0]
            mask = self.rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(length)))
            if opcode == 8:  # close
                self.wfile.write(b"\x88\x00")
                return
            if opcode == 1:
                reply = (name + ":" + data.decode()).encode()
                self.wfile.write(bytes([0x81, len(reply)]) + reply)
                self.wfile.flush()


http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
