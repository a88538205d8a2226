package portdecl

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

const specExample = `
[ports]
step = 10          # distance between candidate families
count = 20         # candidate families; also the cockpit's most concurrently leased stacks

[ports.bases]      # family at offset o: KEY = base + o, for o = 0, step, 2*step, ... (count of them)
HTTP = 8080
DB = 5432

[entrypoints.web]  # optional, any number; each adds entrypoints/<name> and <NAME>_URL in env
port = "HTTP"      # a key of [ports.bases]
path = "/"         # must start with "/"
scheme = "http"    # optional: any URL scheme (http by default, https, postgres, redis …)
hostname = "127.0.0.1"   # optional, default 127.0.0.1; a loopback name or address
`

// ports is a valid [ports] section for documents that test the entrypoints.
const ports = "[ports]\nstep = 10\ncount = 20\n[ports.bases]\nHTTP = 8080\nDB = 5432\n"

func portsWith(step, count string, bases ...string) string {
	return "[ports]\nstep = " + step + "\ncount = " + count + "\n[ports.bases]\n" + strings.Join(bases, "\n") + "\n"
}

func entrypoint(name string, fields ...string) string {
	return "[entrypoints." + name + "]\n" + strings.Join(fields, "\n") + "\n"
}

func TestParseAccepts(t *testing.T) {
	manyEntrypoints := ports
	for i := range maxDeclaredEntrypoints {
		manyEntrypoints += entrypoint(fmt.Sprintf("e%04d", i), `port = "HTTP"`, `path = "/"`)
	}
	tests := []struct {
		name string
		doc  string
		want Config
	}{
		{"the SPEC's example", specExample, Config{
			Declaration: Declaration{Step: 10, Count: 20, Bases: map[string]int{"HTTP": 8080, "DB": 5432}},
			Entrypoints: []Entrypoint{{Name: "web", Port: "HTTP", Path: "/", Scheme: "http", Hostname: "127.0.0.1", Kind: "entrypoint"}},
		}},
		{"no entrypoints", portsWith("1", "1", "A = 1"), Config{
			Declaration: Declaration{Step: 1, Count: 1, Bases: map[string]int{"A": 1}},
		}},
		{"an empty [entrypoints]", portsWith("1", "1", "A = 1") + "[entrypoints]\n", Config{
			Declaration: Declaration{Step: 1, Count: 1, Bases: map[string]int{"A": 1}},
		}},
		{"defaults filled in, sorted by name", ports +
			entrypoint("zeta", `port = "DB"`, `path = "/z?x=1,y=%23f"`, `kind = "oauth-callback"`) +
			entrypoint(`"Admin-v2"`, `port = "HTTP"`, `path = "/admin/"`, `scheme = "https"`), Config{
			Declaration: Declaration{Step: 10, Count: 20, Bases: map[string]int{"HTTP": 8080, "DB": 5432}},
			Entrypoints: []Entrypoint{
				{Name: "Admin-v2", Port: "HTTP", Path: "/admin/", Scheme: "https", Hostname: "127.0.0.1", Kind: "entrypoint"},
				{Name: "zeta", Port: "DB", Path: "/z?x=1,y=%23f", Scheme: "http", Hostname: "127.0.0.1", Kind: "oauth-callback"},
			},
		}},
		{"loopback hostnames; IPv6 kept bracketed", ports +
			entrypoint("a", `port = "HTTP"`, `path = "/"`, `hostname = "localhost"`) +
			entrypoint("b", `port = "HTTP"`, `path = "/"`, `hostname = "127.1.2.3"`) +
			entrypoint("c", `port = "HTTP"`, `path = "/"`, `hostname = "::1"`) +
			entrypoint("d", `port = "HTTP"`, `path = "/"`, `hostname = "[::1]"`), Config{
			Declaration: Declaration{Step: 10, Count: 20, Bases: map[string]int{"HTTP": 8080, "DB": 5432}},
			Entrypoints: []Entrypoint{
				{Name: "a", Port: "HTTP", Path: "/", Scheme: "http", Hostname: "localhost", Kind: "entrypoint"},
				{Name: "b", Port: "HTTP", Path: "/", Scheme: "http", Hostname: "127.1.2.3", Kind: "entrypoint"},
				{Name: "c", Port: "HTTP", Path: "/", Scheme: "http", Hostname: "[::1]", Kind: "entrypoint"},
				{Name: "d", Port: "HTTP", Path: "/", Scheme: "http", Hostname: "[::1]", Kind: "entrypoint"},
			},
		}},
		{"dots and brackets in comments do not nest", ports +
			"# [[[[[[[[[[[[[[[[[[ a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q.r {{{{{{{{{{{{{{{{{{{\n" +
			entrypoint("w", `port = "HTTP"`, `path = '/a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q.r/'`), Config{
			Declaration: Declaration{Step: 10, Count: 20, Bases: map[string]int{"HTTP": 8080, "DB": 5432}},
			Entrypoints: []Entrypoint{
				{Name: "w", Port: "HTTP", Path: "/a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q.r/", Scheme: "http", Hostname: "127.0.0.1", Kind: "entrypoint"},
			},
		}},
		{"ports as an inline table", "ports = {step = 10, count = 2, bases = {HTTP = 8080}}\n", Config{
			Declaration: Declaration{Step: 10, Count: 2, Bases: map[string]int{"HTTP": 8080}},
		}},
		{"count × bases = 1024", portsWith("1", "256", "A = 1000", "B = 2000", "C = 3000", "D = 4000"), Config{
			Declaration: Declaration{Step: 1, Count: 256, Bases: map[string]int{"A": 1000, "B": 2000, "C": 3000, "D": 4000}},
		}},
		{"the highest candidate is 65535", portsWith("100", "2", "TOP = 65435"), Config{
			Declaration: Declaration{Step: 100, Count: 2, Bases: map[string]int{"TOP": 65435}},
		}},
		{"one family with the largest safe step", portsWith("9007199254740991", "1", "A = 1"), Config{
			Declaration: Declaration{Step: 9007199254740991, Count: 1, Bases: map[string]int{"A": 1}},
		}},
	}
	for _, test := range tests {
		t.Run(test.name, func(t *testing.T) {
			got, err := Parse([]byte(test.doc))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			// The order is TestParseKeepsBaseOrder's; here it must name every base once.
			if !slices.Equal(slices.Sorted(slices.Values(got.BaseOrder)), slices.Sorted(maps.Keys(got.Declaration.Bases))) {
				t.Errorf("BaseOrder %v is not the bases %v", got.BaseOrder, got.Declaration.Bases)
			}
			got.BaseOrder = nil
			if !reflect.DeepEqual(got, test.want) {
				t.Errorf("Parse =\n%+v\nwant\n%+v", got, test.want)
			}
		})
	}
	t.Run("1024 declared entrypoints", func(t *testing.T) {
		got, err := Parse([]byte(manyEntrypoints))
		if err != nil {
			t.Fatalf("Parse: %v", err)
		}
		if len(got.Entrypoints) != maxDeclaredEntrypoints {
			t.Errorf("got %d entrypoints, want %d", len(got.Entrypoints), maxDeclaredEntrypoints)
		}
	})
}

func TestParseRefuses(t *testing.T) {
	web := func(fields ...string) string { return ports + entrypoint("web", fields...) }
	tooManyEntrypoints := ports
	for i := range maxDeclaredEntrypoints + 1 {
		tooManyEntrypoints += entrypoint(fmt.Sprintf("e%04d", i), `port = "HTTP"`, `path = "/"`)
	}
	tests := []struct {
		name, doc, want string
	}{
		// The document.
		{"over 64 KiB", ports + "#" + strings.Repeat("x", MaxDocumentBytes), "more than 65536"},
		{"TOML syntax error", "[ports\nstep = 1\n", "config: toml:"},
		{"C1 control in a comment", "# \u009b2J\n" + ports, "config: line 1: control character U+009B, which a terminal reading the document would act on"},
		{"ESC in a comment", ports + "# \x1b]0;pwned\x07\n", "control character U+001B"},
		{"lone carriage return", ports + "# fine\rforged\n", "control character U+000D"},
		{"right-to-left override in a comment", ports + "# HTTP = 1\u202e0008 = \n", "config: line 7: bidirectional control character U+202E"},
		{"isolate in a comment", "# \u2066x\u2069\n" + ports, "config: line 1: bidirectional control character U+2066"},
		{"an integer TOML cannot hold", portsWith("9223372036854775808", "1", "A = 1"), "config: toml:"},
		{"empty document", "", "config: no [ports] table"},
		{"only entrypoints", entrypoint("web", `port = "HTTP"`, `path = "/"`), "config: no [ports] table"},
		{"unknown table", ports + "[portz]\nstep = 1\n", "portz: unknown key"},
		{"unknown top-level key", "extra = 1\n" + ports, "extra: unknown key"},
		{"unknown key in [ports]", "[ports]\nstepp = 1\nstep = 1\ncount = 1\n[ports.bases]\nA = 1\n", "ports.stepp: unknown key"},
		{"keys are case-sensitive", "[ports]\nSTEP = 1\ncount = 1\n[ports.bases]\nA = 1\n", "ports.STEP: unknown key"},
		{"ports is not a table", "ports = 5\n", "ports: must be a table, got integer 5"},
		{"a key of 18 parts", "a" + strings.Repeat(".a", 17) + " = 1\n" + ports, "config: line 1: keys or values nest more than 16 deep"},
		{"a key of 17 parts is not too deep", "a" + strings.Repeat(".a", 16) + " = 1\n" + ports, "a: unknown key"},
		{"a 64 KiB dotted key", "a" + strings.Repeat(".a", 30000) + " = 1\n", "nest more than 16 deep"},
		{"inline tables nested 17 deep", ports + "x = " + strings.Repeat("{b=", 17) + "1" + strings.Repeat("}", 17) + "\n", "config: line 7: keys or values nest more than 16 deep"},
		{"64 KiB of inline tables", "x = " + strings.Repeat("{b=", 15000) + "1" + strings.Repeat("}", 15000), "nest more than 16 deep"},
		{"arrays nested 17 deep", ports + "x = " + strings.Repeat("[", 17) + strings.Repeat("]", 17) + "\n", "nest more than 16 deep"},
		{"a dotted key inside inline tables", "x = {a={b={c.d.e.f.g.h.i.j.k.l.m.n.o.p.q=1}}}\n", "nest more than 16 deep"},
		// step and count.
		{"step missing", "[ports]\ncount = 1\n[ports.bases]\nA = 1\n", "ports.step: required"},
		{"count missing", "[ports]\nstep = 1\n[ports.bases]\nA = 1\n", "ports.count: required"},
		{"step is a float", portsWith("10.0", "1", "A = 1"), "ports.step: must be an integer, got float 10"},
		{"step is a string", portsWith(`"10"`, "1", "A = 1"), `ports.step: must be an integer, got string "10"`},
		{"step is a boolean", portsWith("true", "1", "A = 1"), "ports.step: must be an integer, got boolean"},
		{"step is a date", portsWith("1979-05-27", "1", "A = 1"), "ports.step: must be an integer, got a date"},
		{"count is a float", portsWith("1", "2.5", "A = 1"), "ports.count: must be an integer, got float 2.5"},
		{"step is zero", portsWith("0", "1", "A = 1"), "ports.step: 0 is less than 1"},
		{"step is negative", portsWith("-10", "1", "A = 1"), "ports.step: -10 is less than 1"},
		{"step is the least int64", portsWith("-9223372036854775808", "1", "A = 1"), "ports.step: -9223372036854775808 is less than 1"},
		{"count is zero", portsWith("1", "0", "A = 1"), "ports.count: 0 is less than 1"},
		{"count is negative", portsWith("1", "-3", "A = 1"), "ports.count: -3 is less than 1"},
		// Bases.
		{"no [ports.bases]", "[ports]\nstep = 1\ncount = 1\n", "ports.bases: at least one base is required"},
		{"empty [ports.bases]", portsWith("1", "1"), "ports.bases: at least one base is required"},
		{"bases is not a table", "[ports]\nstep = 1\ncount = 1\nbases = 5\n", "ports.bases: must be a table"},
		{"base is a string", portsWith("1", "1", `HTTP = "8080"`), `ports.bases.HTTP: must be an integer, got string "8080"`},
		{"base is a float", portsWith("1", "1", "HTTP = 8080.5"), "ports.bases.HTTP: must be an integer, got float"},
		{"base is a table", portsWith("1", "1", "HTTP = {x = 1}"), "ports.bases.HTTP: must be an integer, got a table"},
		{"key is lower-case", portsWith("1", "1", "http = 8080"), "ports.bases.http: key does not match ^[A-Z][A-Z0-9_]*$"},
		{"key starts with a digit", portsWith("1", "1", "1HTTP = 8080"), "ports.bases.1HTTP: key does not match"},
		{"key has a dash", portsWith("1", "1", "HTTP-ADMIN = 8080"), "ports.bases.HTTP-ADMIN: key does not match"},
		{"key needs quoting", portsWith("1", "1", `"A B" = 8080`), `ports.bases."A B": key does not match`},
		{"key with a newline is quoted", portsWith("1", "1", `"A\nB" = 8080`), `ports.bases."A\nB": key does not match`},
		{"base above 65535", portsWith("1", "1", "HTTP = 70000"), "ports.bases.HTTP: 70000 is outside 1-65535"},
		{"base zero", portsWith("1", "1", "HTTP = 0"), "ports.bases.HTTP: 0 is outside 1-65535"},
		{"base negative", portsWith("1", "1", "HTTP = -80"), "ports.bases.HTTP: -80 is outside 1-65535"},
		{"duplicate bases", portsWith("1", "1", "HTTP = 8080", "WEB = 8080"), "ports.bases: HTTP and WEB are both 8080"},
		// Families.
		{"overlapping families", portsWith("10", "2", "HTTP = 8080", "DB = 8090"),
			"ports: port 8090 is in two candidate families (DB at offset 0 and HTTP at offset 10)"},
		{"a candidate above 65535", portsWith("10", "2", "HTTP = 65530"), "ports: HTTP at offset 10 would be 65540, outside 1-65535"},
		{"count × bases = 1025, one base", portsWith("1", "1025", "A = 1"), "ports.count: 1025 families × 1 bases is more than 1024 candidate ports"},
		{"count × bases = 1025, five bases", portsWith("1", "205", "A = 1000", "B = 2000", "C = 3000", "D = 4000", "E = 5000"),
			"ports.count: 205 families × 5 bases is more than 1024"},
		{"huge step", portsWith("9223372036854775807", "20", "HTTP = 8080"), "ports.step: 9223372036854775807 puts the family at offset 9223372036854775807 above port 65535"},
		{"huge step, one family", portsWith("9223372036854775807", "1", "HTTP = 8080"), "ports.step: 9223372036854775807 is more than 9007199254740991"},
		{"huge count", portsWith("10", "1000000000", "HTTP = 8080"), "ports.count: 1000000000 families × 1 bases is more than 1024"},
		{"largest count", portsWith("10", "9223372036854775807", "HTTP = 8080"), "ports.count: 9223372036854775807 families"},
		{"huge step and count", portsWith("9223372036854775807", "9223372036854775807", "HTTP = 8080"), "ports.count: 9223372036854775807 families"},
		// Entrypoints.
		{"entrypoints is not a table", "entrypoints = 5\n" + ports, "entrypoints: must be a table, got integer 5"},
		{"entrypoint is an array of tables", ports + "[[entrypoints.web]]\nport = \"HTTP\"\npath = \"/\"\n", "entrypoints.web: must be a table, got an array"},
		{"entrypoint is not a table", ports + "[entrypoints]\nweb = \"HTTP\"\n", `entrypoints.web: must be a table, got string "HTTP"`},
		{"more than 1024 entrypoints", tooManyEntrypoints, "entrypoints: 1025 declared, more than 1024"},
		{"unknown key in an entrypoint", web(`port = "HTTP"`, `path = "/"`, `portt = "HTTP"`), "entrypoints.web.portt: unknown key"},
		{"port missing", web(`path = "/"`), "entrypoints.web.port: required"},
		{"port is an integer", web(`port = 8080`, `path = "/"`), "entrypoints.web.port: must be a string, got integer 8080"},
		{"port is not declared", web(`port = "HTTPS"`, `path = "/"`), `entrypoints.web.port: "HTTPS" is not a key of [ports.bases]`},
		{"path missing", web(`port = "HTTP"`), "entrypoints.web.path: required"},
		{"path is empty", web(`port = "HTTP"`, `path = ""`), `entrypoints.web.path: "" does not start with "/"`},
		{"path is relative", web(`port = "HTTP"`, `path = "app"`), `entrypoints.web.path: "app" does not start with "/"`},
		{"path has a space", web(`port = "HTTP"`, `path = "/a b"`), `entrypoints.web.path: "/a b" has byte 0x20 at byte 2: a path is ASCII letters, digits`},
		{"path has a tab", web(`port = "HTTP"`, `path = "/a\tb"`), "has byte 0x09 at byte 2"},
		{"path has a newline", web(`port = "HTTP"`, `path = "/a\nWEB_URL=x"`), "has byte 0x0a at byte 2"},
		{"path has DEL", web(`port = "HTTP"`, `path = "/a\u007f"`), "has byte 0x7f at byte 2"},
		{"path has ESC", web(`port = "HTTP"`, `path = "/a\u001b[31m"`), "has byte 0x1b at byte 2"},
		{"path has a line separator", web(`port = "HTTP"`, `path = "/a\u2028"`), "has byte 0xe2 at byte 2"},
		{"path has a no-break space", web(`port = "HTTP"`, `path = "/a\u00a0"`), "has byte 0xc2 at byte 2"},
		// What a shell would run or expand, or a dotenv reader would cut.
		{"path has a command substitution", web(`port = "HTTP"`, `path = "/$(id>/tmp/x)"`), `has "$" at byte 1`},
		{"path has backquotes", web(`port = "HTTP"`, "path = \"/`id`\""), "has \"`\" at byte 1"},
		{"path has a semicolon", web(`port = "HTTP"`, `path = "/a;id"`), `has ";" at byte 2`},
		{"path has an ampersand", web(`port = "HTTP"`, `path = "/?a=1&b=2"`), `has "&" at byte 5`},
		{"path has a pipe", web(`port = "HTTP"`, `path = "/a|id"`), `has "|" at byte 2`},
		{"path has a single quote", web(`port = "HTTP"`, `path = "/a'b"`), `has "'" at byte 2`},
		{"path has a double quote", web(`port = "HTTP"`, `path = '/a"b'`), `has "\"" at byte 2`},
		{"path has a backslash", web(`port = "HTTP"`, `path = '/a\b'`), `has "\\" at byte 2`},
		{"path has parentheses", web(`port = "HTTP"`, `path = "/a(b)"`), `has "(" at byte 2`},
		{"path has a redirection", web(`port = "HTTP"`, `path = "/a>b"`), `has ">" at byte 2`},
		{"path has a fragment", web(`port = "HTTP"`, `path = "/#/login"`), `has "#" at byte 1`},
		{"path has a brace", web(`port = "HTTP"`, `path = "/{a}"`), `has "{" at byte 1`},
		{"path has a bracket", web(`port = "HTTP"`, `path = "/[a]"`), `has "[" at byte 1`},
		{"path has a bang", web(`port = "HTTP"`, `path = "/a!b"`), `has "!" at byte 2`},
		{"path has a tilde after a colon", web(`port = "HTTP"`, `path = "/a:~root"`), `"/a:~root" has "~" after ":" at byte 3`},
		{"path has a bare percent", web(`port = "HTTP"`, `path = "/100%"`), `has "%" at byte 4`},
		{"path has a percent without hex", web(`port = "HTTP"`, `path = "/%zz"`), `has "%" at byte 1`},
		// Names a shell cannot assign, or that change how the reader's programs run.
		{"entrypoint's variable has a dot", ports + entrypoint(`"Admin.v2"`, `port = "HTTP"`, `path = "/"`),
			`entrypoints."Admin.v2": the env file would export "ADMIN.V2_URL", which is not a variable name a shell assigns`},
		{"entrypoint's variable starts with a digit", ports + entrypoint("2web", `port = "HTTP"`, `path = "/"`),
			`entrypoints.2web: the env file would export "2WEB_URL", which is not a variable name`},
		{"port key PATH", portsWith("10", "2", "PATH = 25060"), "ports.bases.PATH: the env file would export PATH, which shells, loaders or interpreters read (docs/env.md)"},
		{"port key BASH_ENV", portsWith("10", "2", "BASH_ENV = 25060"), "ports.bases.BASH_ENV: the env file would export BASH_ENV, which"},
		{"port key LD_PRELOAD", portsWith("10", "2", "LD_PRELOAD = 25060"), "ports.bases.LD_PRELOAD: the env file would export LD_PRELOAD"},
		{"port key HOME", portsWith("10", "2", "HOME = 25060"), "ports.bases.HOME: the env file would export HOME"},
		{"port key HTTP_PROXY", portsWith("10", "2", "HTTP_PROXY = 25060"), "ports.bases.HTTP_PROXY: the env file would export HTTP_PROXY"},
		{"port key IFS", portsWith("10", "2", "IFS = 25060"), "ports.bases.IFS: the env file would export IFS"},
		{"entrypoint PIP_INDEX_URL", ports + entrypoint("pip-index", `port = "HTTP"`, `path = "/simple"`),
			"entrypoints.pip-index: the env file would export PIP_INDEX_URL, which"},
		{"prefix LD_ makes LD_PRELOAD", portsWith("10", "2", "PRELOAD = 25060") + "[env]\nprefix = \"LD_\"\n",
			"ports.bases.PRELOAD: the env file would export LD_PRELOAD, which"},
		{"prefix NODE_ makes NODE_OPTIONS", portsWith("10", "2", "OPTIONS = 25060") + "[env]\nprefix = \"NODE_\"\n",
			"ports.bases.OPTIONS: the env file would export NODE_OPTIONS"},
		{"prefix GIT_ with an entrypoint", ports + entrypoint("proxy", `port = "HTTP"`, `path = "/"`) + "[env]\nprefix = \"GIT_\"\n",
			"ports.bases.DB: the env file would export GIT_DB"},
		{"scheme with a colon", web(`port = "HTTP"`, `path = "/"`, `scheme = "ftp:"`), `entrypoints.web.scheme: "ftp:" is not a URL scheme`},
		{"scheme is upper-case", web(`port = "HTTP"`, `path = "/"`, `scheme = "HTTP"`), `entrypoints.web.scheme: "HTTP" is not a URL scheme`},
		{"scheme is empty", web(`port = "HTTP"`, `path = "/"`, `scheme = ""`), `entrypoints.web.scheme: "" is not a URL scheme`},
		{"kind is upper-case", web(`port = "HTTP"`, `path = "/"`, `kind = "OAuth"`), `entrypoints.web.kind: "OAuth" is not a kind`},
		{"kind is empty", web(`port = "HTTP"`, `path = "/"`, `kind = ""`), `entrypoints.web.kind: "" is not a kind`},
		{"kind is not a string", web(`port = "HTTP"`, `path = "/"`, `kind = 1`), `entrypoints.web.kind: must be a string`},
		{"scheme starts with a digit", web(`port = "HTTP"`, `path = "/"`, `scheme = "2http"`), `is not a URL scheme`},
		{"hostname is a remote name", web(`port = "HTTP"`, `path = "/"`, `hostname = "example.com"`), `entrypoints.web.hostname: "example.com" is not a loopback name or address`},
		{"hostname is empty", web(`port = "HTTP"`, `path = "/"`, `hostname = ""`), `entrypoints.web.hostname: "" is not a loopback`},
		{"hostname is a private address", web(`port = "HTTP"`, `path = "/"`, `hostname = "10.0.0.1"`), `"10.0.0.1" is not a loopback`},
		{"hostname is the any address", web(`port = "HTTP"`, `path = "/"`, `hostname = "0.0.0.0"`), `"0.0.0.0" is not a loopback`},
		{"hostname is a short IPv4 form", web(`port = "HTTP"`, `path = "/"`, `hostname = "127.1"`), `"127.1" is not a loopback`},
		{"hostname is IPv4-mapped loopback", web(`port = "HTTP"`, `path = "/"`, `hostname = "::ffff:127.0.0.1"`), `"::ffff:127.0.0.1" is not a loopback`},
		{"hostname is a zoned ::1", web(`port = "HTTP"`, `path = "/"`, `hostname = "::1%lo"`), `"::1%lo" is not a loopback`},
		{"hostname is upper-case localhost", web(`port = "HTTP"`, `path = "/"`, `hostname = "LOCALHOST"`), `"LOCALHOST" is not a loopback`},
		{"hostname is an integer", web(`port = "HTTP"`, `path = "/"`, `hostname = 1`), "entrypoints.web.hostname: must be a string"},
		{"name starts with a dot", ports + entrypoint(`".web"`, `port = "HTTP"`, `path = "/"`), `entrypoints.".web": a name is 1-128 bytes of [A-Za-z0-9._-], not starting with '.' or '-'`},
		{"name starts with a dash", ports + entrypoint("-web", `port = "HTTP"`, `path = "/"`), "entrypoints.-web: a name is 1-128 bytes"},
		{"name has a space", ports + entrypoint(`"my web"`, `port = "HTTP"`, `path = "/"`), `entrypoints."my web": a name is 1-128 bytes`},
		{"name is empty", ports + entrypoint(`""`, `port = "HTTP"`, `path = "/"`), `entrypoints."": a name is 1-128 bytes`},
		{"name is 129 bytes", ports + entrypoint(strings.Repeat("w", 129), `port = "HTTP"`, `path = "/"`), "a name is 1-128 bytes"},
		{"name is a default entrypoint", ports + entrypoint("http", `port = "DB"`, `path = "/"`), "entrypoints.http: the name is taken by the default entrypoint of port HTTP"},
		{"name is a two-word default entrypoint", portsWith("10", "2", "HTTP_ADMIN = 9000") + entrypoint("http-admin", `port = "HTTP_ADMIN"`, `path = "/"`),
			"entrypoints.http-admin: the name is taken by the default entrypoint of port HTTP_ADMIN"},
		{"two names, one variable", ports + entrypoint("Web", `port = "HTTP"`, `path = "/"`) + entrypoint("web", `port = "HTTP"`, `path = "/"`),
			"entrypoints.web: it sets WEB_URL, which entrypoint Web sets too"},
		{"a name whose variable is a default's", ports + entrypoint("Http", `port = "HTTP"`, `path = "/"`),
			"entrypoints.Http: it sets HTTP_URL, which default entrypoint http sets too"},
		{"a default's variable is a port key", portsWith("10", "2", "HTTP = 8080", "HTTP_URL = 9000"),
			"ports.bases.HTTP: its default entrypoint http sets HTTP_URL, which port key HTTP_URL sets too"},
	}
	// What only the whole document shows: something it lacks, which a further line may add (in
	// the section the document ends in, or under a header not used yet).
	judgedWhole := map[string]bool{"empty document": true, "only entrypoints": true, "no [ports.bases]": true,
		"empty [ports.bases]": true, "port missing": true, "path missing": true,
		// An [env] prefix may still change every name.
		"entrypoint's variable has a dot": true, "entrypoint's variable starts with a digit": true,
		"port key PATH": true, "port key BASH_ENV": true, "port key LD_PRELOAD": true, "port key HOME": true,
		"port key HTTP_PROXY": true, "port key IFS": true, "entrypoint PIP_INDEX_URL": true}
	for _, test := range tests {
		t.Run(test.name, func(t *testing.T) {
			got, err := Parse([]byte(test.doc))
			if err == nil {
				t.Fatalf("Parse accepted %+v, want an error containing %q", got, test.want)
			}
			if !strings.Contains(err.Error(), test.want) {
				t.Errorf("Parse error %q does not contain %q", err, test.want)
			}
			// As a prefix of a longer document, the same error, unless a further line may fix it.
			switch err := ParsePrefix([]byte(test.doc)); {
			case judgedWhole[test.name] && err != nil:
				t.Errorf("ParsePrefix refused what a further line may add: %v", err)
			case !judgedWhole[test.name] && (err == nil || !strings.Contains(err.Error(), test.want)):
				t.Errorf("ParsePrefix error %v, want one containing %q", err, test.want)
			}
		})
	}
}

// ParsePrefix refuses a document's beginning only when no further line can make it valid.
func TestParsePrefix(t *testing.T) {
	for _, test := range []struct{ name, doc, want string }{
		// Open at the end: more lines may close it.
		{"an array still open", ports + "[entrypoints.web]\nport = [\n", ""},
		{"an array open after a value", "x = [1,\n", ""},
		{"a multi-line string still open", ports + "[entrypoints.web]\npath = \"\"\"/a\n", ""},
		{"a multi-line literal string still open", ports + "[entrypoints.web]\npath = '''/a\n", ""},
		{"an entrypoint before the bases it names", "[entrypoints.web]\nport = \"HTTP\"\n", ""},
		{"an entrypoint without a path yet", ports + "[entrypoints.web]\nport = \"HTTP\"\n", ""},
		{"a section begun", "[ports]\n", ""},
		{"a step given, no count yet", "[ports]\nstep = 10\n", ""},
		{"a count given, no step yet", "[ports]\ncount = 4\n", ""},
		{"bases, then a [ports] that may still get step", "[ports.bases]\nA = 1\n[ports]\ncount = 4\n", ""},
		{"bases before step and count", "[ports.bases]\nHTTP = 8080\n", ""},
		// Complete lines no further line can repair.
		{"a line without a value", "[ports]\nstep =\n", "config: toml:"},
		{"a table header not closed", "[ports\n", "config: toml:"},
		{"a string across lines", "[ports]\nx = \"a\n", "config: toml:"},
		{"a value that is no value", "[ports]\nstep = ten\n", "config: toml:"},
		{"an array with a broken element", "x = [1,\n 2 3\n", "config: toml:"},
		{"a key given twice", "[ports]\nstep = 10\nstep = 20\n", "already been defined"},
		{"a table given twice", "[ports]\nstep = 10\n[ports]\n", "already been defined"},
		{"an unknown key before the rest", "[ports]\nstepp = 10\n", "ports.stepp: unknown key"},
		{"an unknown table", "[port]\n", "port: unknown key"},
		{"a step of 0 before the count", "[ports]\nstep = 0\n", "ports.step: 0 is less than 1"},
		{"a base out of range before step", "[ports.bases]\nHTTP = 70000\n", "ports.bases.HTTP: 70000 is outside 1-65535"},
		{"a scheme before the port", "[entrypoints.web]\nscheme = \"HTTP\"\n", "entrypoints.web.scheme"},
		{"an entrypoint named as a default", ports + "[entrypoints.http]\n", "taken by the default entrypoint"},
		{"overlapping families so far", "[ports]\nstep = 10\ncount = 2\n[ports.bases]\nA = 8080\nB = 8090\n", "in two candidate families"},
		{"too many candidates so far", "[ports.bases]\nA = 1000\nB = 2000\n[ports]\ncount = 600\n", "more than 1024 candidate ports"},
		// Missing from a section that can no longer gain it: another header followed it.
		{"count missing, [ports] ended", "[ports]\nstep = 10\n[ports.bases]\n", "ports.count: required"},
		{"a port key the ended bases lack", ports + "[entrypoints.web]\nport = \"HTTPS\"\n", `"HTTPS" is not a key of [ports.bases]`},
		{"a path missing, the entrypoint ended", ports + "[entrypoints]\n[entrypoints.web]\nport = \"HTTP\"\n[entrypoints.api]\n", "entrypoints.web.path: required"},
		// The decoder lets a header [entrypoints] not used yet add web.path by a dotted key.
		{"a path missing, [entrypoints] still unused", ports + "[entrypoints.web]\nport = \"HTTP\"\n[entrypoints.api]\n", ""},
		{"bases empty, their section ended", "[ports]\nstep = 10\ncount = 2\n[ports.bases]\n[entrypoints.web]\n", "ports.bases: at least one base is required"},
		{"a bad prefix", "[env]\nprefix = \"app\"\n", "env.prefix"},
		{"an entrypoint's port that no base can be", "[entrypoints.web]\nport = \"http\"\n", `"http" is not a key of [ports.bases]`},
	} {
		t.Run(test.name, func(t *testing.T) {
			err := ParsePrefix([]byte(test.doc))
			if test.want == "" && err != nil {
				t.Fatalf("ParsePrefix(%q) = %v; a further line may still make it valid", test.doc, err)
			}
			if test.want != "" && (err == nil || !strings.Contains(err.Error(), test.want)) {
				t.Fatalf("ParsePrefix(%q) = %v, want an error containing %q", test.doc, err, test.want)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		d    Declaration
		want string // "" when valid
	}{
		{"valid", Declaration{Step: 10, Count: 20, Bases: map[string]int{"HTTP": 8080, "DB": 5432}}, ""},
		{"nil bases", Declaration{Step: 1, Count: 1}, "ports.bases: at least one base is required"},
		{"empty key", Declaration{Step: 1, Count: 1, Bases: map[string]int{"": 80}}, `ports.bases."": key does not match`},
		{"largest int step and count", Declaration{Step: 1<<63 - 1, Count: 1<<63 - 1, Bases: map[string]int{"A": 1}}, "ports.count: 9223372036854775807 families"},
		{"least int step", Declaration{Step: -1 << 63, Count: 1, Bases: map[string]int{"A": 1}}, "ports.step: -9223372036854775808 is less than 1"},
		{"largest int base", Declaration{Step: 1, Count: 1, Bases: map[string]int{"A": 1<<63 - 1}}, "ports.bases.A: 9223372036854775807 is outside 1-65535"},
		{"step 65535 with two families", Declaration{Step: 65535, Count: 2, Bases: map[string]int{"A": 1}}, "ports: A at offset 65535 would be 65536"},
		{"step 65536 with two families", Declaration{Step: 65536, Count: 2, Bases: map[string]int{"A": 1}}, "ports.step: 65536 puts the family"},
		{"families interleave without overlap", Declaration{Step: 2, Count: 3, Bases: map[string]int{"A": 100, "B": 101}}, ""},
		{"families interleave and overlap", Declaration{Step: 2, Count: 3, Bases: map[string]int{"A": 100, "B": 102}},
			"ports: port 102 is in two candidate families (B at offset 0 and A at offset 2)"},
	}
	for _, test := range tests {
		t.Run(test.name, func(t *testing.T) {
			err := test.d.Validate()
			switch {
			case test.want == "" && err != nil:
				t.Errorf("Validate: %v", err)
			case test.want != "" && err == nil:
				t.Errorf("Validate accepted, want an error containing %q", test.want)
			case test.want != "" && !strings.Contains(err.Error(), test.want):
				t.Errorf("Validate error %q does not contain %q", err, test.want)
			}
		})
	}
}

// TestPlainlyValidAgreesWithValidate holds Validate's fast path to the full check: it accepts
// nothing the full check refuses, and, up to maxPairedBases bases, everything it accepts.
func TestPlainlyValidAgreesWithValidate(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	keys := []string{"A", "B", "C", "HTTP", "DB", "X_1", "a", ""}
	// Small steps, counts and bases so that collisions, ranges and edges all come up.
	pick := func(values ...int) int { return values[r.IntN(len(values))] }
	accepted := 0
	for range 200000 {
		d := Declaration{
			Step:  pick(-1, 0, 1, 2, 3, 5, 10, r.IntN(40), 65535, 65536, 1<<53, 1<<53-1),
			Count: pick(0, 1, 2, 3, 4, 20, r.IntN(30), 512, 1024, 1025),
			Bases: map[string]int{},
		}
		for range r.IntN(5) {
			d.Bases[keys[r.IntN(len(keys))]] = pick(0, 1, 2, 100, 100+r.IntN(40), 65000+r.IntN(600), 65535, 65536)
		}
		full := d.validate(known{step: true, count: true, bases: true})
		fast := d.plainlyValid()
		if fast && full != nil {
			t.Fatalf("plainlyValid accepts %+v, which validate refuses: %v", d, full)
		}
		if !fast && full == nil && len(d.Bases) <= maxPairedBases {
			t.Fatalf("plainlyValid refuses %+v, which validate accepts", d)
		}
		if fast {
			accepted++
		}
	}
	if accepted < 1000 {
		t.Fatalf("only %d of the declarations were valid: the test hardly tries the fast path", accepted)
	}
}

func TestCandidatesAndFamilyAt(t *testing.T) {
	d := Declaration{Step: 10, Count: 3, Bases: map[string]int{"HTTP": 8080, "DB": 5432}}
	want := []Family{
		{Offset: 0, Ports: map[string]int{"HTTP": 8080, "DB": 5432}},
		{Offset: 10, Ports: map[string]int{"HTTP": 8090, "DB": 5442}},
		{Offset: 20, Ports: map[string]int{"HTTP": 8100, "DB": 5452}},
	}
	if got := d.Candidates(); !reflect.DeepEqual(got, want) {
		t.Errorf("Candidates = %+v, want %+v", got, want)
	}
	for _, family := range want {
		got, ok := d.FamilyAt(family.Offset)
		if !ok || !reflect.DeepEqual(got, family) {
			t.Errorf("FamilyAt(%d) = %+v, %t; want %+v, true", family.Offset, got, ok, family)
		}
	}
	for _, offset := range []int{-10, -1, 5, 11, 30, 1 << 62} {
		if got, ok := d.FamilyAt(offset); ok {
			t.Errorf("FamilyAt(%d) = %+v, want not a candidate", offset, got)
		}
	}

	invalid := Declaration{Step: 10, Count: 1_000_000_000, Bases: map[string]int{"HTTP": 8080}}
	if got := invalid.Candidates(); got != nil {
		t.Errorf("Candidates of an invalid declaration has %d families, want nil", len(got))
	}
	if _, ok := invalid.FamilyAt(0); ok {
		t.Errorf("FamilyAt(0) of an invalid declaration is ok")
	}
	if _, ok := (Declaration{}).FamilyAt(0); ok {
		t.Errorf("FamilyAt(0) of the zero declaration is ok")
	}
}

func TestEntrypoints(t *testing.T) {
	leased := map[string]int{"HTTP": 8090, "HTTP_ADMIN": 8091, "DB": 5442}
	declared := []Entrypoint{
		{Name: "web", Port: "HTTP", Path: "/app?x=1", Scheme: "https", Hostname: "localhost", Kind: "entrypoint"},
		{Name: "db-v6", Port: "DB", Path: "/", Scheme: "http", Hostname: "[::1]", Kind: "entrypoint"},
		{Name: "bare", Port: "HTTP_ADMIN", Path: "/bare", Kind: "oauth-callback"},
		{Name: "v6-unbracketed", Port: "DB", Path: "/x", Hostname: "::1", Kind: "entrypoint"},
		{Name: "stale", Port: "GONE", Path: "/"},
		{Name: "http", Port: "DB", Path: "/shadow"},
	}
	want := []Resolved{
		{"bare", "http://127.0.0.1:8091/bare", "oauth-callback", "HTTP_ADMIN", false, false},
		{"db", "http://127.0.0.1:5442/", "entrypoint", "DB", true, false},
		{"db-v6", "http://[::1]:5442/", "entrypoint", "DB", false, false},
		{"http", "http://127.0.0.1:8090/", "entrypoint", "HTTP", true, false},
		{"http-admin", "http://127.0.0.1:8091/", "entrypoint", "HTTP_ADMIN", true, false},
		{"v6-unbracketed", "http://[::1]:5442/x", "entrypoint", "DB", false, false},
		{"web", "https://localhost:8090/app?x=1", "entrypoint", "HTTP", false, false},
	}
	if got := Entrypoints(declared, leased); !reflect.DeepEqual(got, want) {
		t.Errorf("Entrypoints =\n%v\nwant\n%v", got, want)
	}
	if got := Entrypoints(nil, nil); len(got) != 0 {
		t.Errorf("Entrypoints(nil, nil) = %v, want none", got)
	}

	config, err := Parse([]byte(specExample))
	if err != nil {
		t.Fatal(err)
	}
	family, _ := config.Declaration.FamilyAt(10)
	wantSpec := []Resolved{
		{"db", "http://127.0.0.1:5442/", "entrypoint", "DB", true, false},
		{"http", "http://127.0.0.1:8090/", "entrypoint", "HTTP", true, false},
		{"web", "http://127.0.0.1:8090/", "entrypoint", "HTTP", false, false},
	}
	if got := Entrypoints(config.Entrypoints, family.Ports); !reflect.DeepEqual(got, wantSpec) {
		t.Errorf("Entrypoints of the SPEC's example at offset 10 = %v, want %v", got, wantSpec)
	}
}

func TestEnvName(t *testing.T) {
	for entrypoint, want := range map[string]string{
		"web":        "WEB_URL",
		"http-admin": "HTTP_ADMIN_URL",
		"db":         "DB_URL",
		"Api.v2":     "API.V2_URL",
		"a_b-c":      "A_B_C_URL",
	} {
		if got := EnvName(entrypoint); got != want {
			t.Errorf("EnvName(%q) = %q, want %q", entrypoint, got, want)
		}
	}
}

func TestValidKey(t *testing.T) {
	for key, want := range map[string]bool{
		"HTTP": true, "A": true, "HTTP_ADMIN": true, "A1_": true, "X9": true,
		"": false, "http": false, "Http": false, "1A": false, "_A": false, "A-B": false, "A B": false, "É": false,
	} {
		if got := ValidKey(key); got != want {
			t.Errorf("ValidKey(%q) = %t, want %t", key, got, want)
		}
	}
}

func TestSHA256(t *testing.T) {
	base := Declaration{Step: 10, Count: 20, Bases: map[string]int{"HTTP": 8080, "DB": 5432}}
	canonical := sha256.Sum256([]byte(`{"bases":{"DB":5432,"HTTP":8080},"count":20,"step":10}`))
	if got, want := base.SHA256(), hex.EncodeToString(canonical[:]); got != want {
		t.Errorf("SHA256 = %s, want the sha256 of the canonical JSON, %s", got, want)
	}

	// Built in the other order: Go maps have no order, so this pins that nothing depends on one.
	reordered := Declaration{Bases: map[string]int{}, Count: 20, Step: 10}
	reordered.Bases["DB"] = 5432
	reordered.Bases["HTTP"] = 8080
	for range 20 {
		if reordered.SHA256() != base.SHA256() {
			t.Fatalf("SHA256 differs for equal declarations")
		}
	}

	variants := map[string]Declaration{
		"step":       {Step: 11, Count: 20, Bases: map[string]int{"HTTP": 8080, "DB": 5432}},
		"count":      {Step: 10, Count: 21, Bases: map[string]int{"HTTP": 8080, "DB": 5432}},
		"base value": {Step: 10, Count: 20, Bases: map[string]int{"HTTP": 8081, "DB": 5432}},
		"base key":   {Step: 10, Count: 20, Bases: map[string]int{"HTTPS": 8080, "DB": 5432}},
		"extra base": {Step: 10, Count: 20, Bases: map[string]int{"HTTP": 8080, "DB": 5432, "X": 1}},
		"fewer":      {Step: 10, Count: 20, Bases: map[string]int{"HTTP": 8080}},
		"step/count": {Step: 20, Count: 10, Bases: map[string]int{"HTTP": 8080, "DB": 5432}},
	}
	for name, variant := range variants {
		if variant.SHA256() == base.SHA256() {
			t.Errorf("SHA256 of a declaration differing in %s equals the original's", name)
		}
		if variant.Equal(base) || base.Equal(variant) {
			t.Errorf("Equal is true for a declaration differing in %s", name)
		}
	}
	if !base.Equal(reordered) || !reordered.Equal(base) {
		t.Errorf("Equal is false for equal declarations")
	}
}

// BenchmarkParsePrefixEveryLine is what the daemon spends judging a document bash's printf
// writes a line per write(2): ParsePrefix of every line's prefix, beside one Parse of the whole.
func BenchmarkParsePrefixEveryLine(b *testing.B) {
	for _, entrypoints := range []int{0, 20, 80} {
		doc := specExample
		for i := range entrypoints {
			doc += entrypoint(fmt.Sprintf("e%04d", i), `port = "HTTP"`, `path = "/"`)
		}
		lines := strings.SplitAfter(doc, "\n")
		b.Run(fmt.Sprintf("every line/%d lines", len(lines)), func(b *testing.B) {
			for b.Loop() {
				end := 0
				for _, line := range lines {
					end += len(line)
					if err := ParsePrefix([]byte(doc[:end])); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
		b.Run(fmt.Sprintf("whole/%d lines", len(lines)), func(b *testing.B) {
			for b.Loop() {
				if _, err := Parse([]byte(doc)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A name the env file may not export is refused in a prefix of a document only once no [env]
// prefix can follow to change it.
func TestParsePrefixWaitsForAPrefix(t *testing.T) {
	path := portsWith("10", "2", "PATH = 25060")
	for doc, refused := range map[string]bool{
		path:                                   false, // [env] may follow
		path + "[env]\n":                       false, // prefix may follow in [env]
		path + "[env]\nprefix = \"APP_\"\n":    false,
		path + "[env]\nprefix = \"LD_\"\n":     true,
		path + "[env]\n[entrypoints]\n":        true, // [env] is closed without a prefix
		portsWith("10", "2", "LD_PRELOAD = 1"): false,
	} {
		if err := ParsePrefix([]byte(doc)); (err != nil) != refused {
			t.Errorf("ParsePrefix(%q) = %v, want refused %t", doc, err, refused)
		}
	}
}

// The seeds lease a declaration's bases in the order it declares them, and list the default
// entrypoints in that order: Parse keeps it, whichever way the table is written.
func TestParseKeepsBaseOrder(t *testing.T) {
	for _, doc := range []string{
		"[ports]\nstep = 10\ncount = 2\n[ports.bases]\nHTTP = 8080\nDB = 5432\nAPI = 9000\n",
		"ports = {step = 10, count = 2, bases = {HTTP = 8080, DB = 5432, API = 9000}}\n",
		"[ports]\nstep = 10\ncount = 2\nbases.HTTP = 8080\nbases.DB = 5432\nbases.API = 9000\n",
	} {
		got, err := Parse([]byte(doc))
		if err != nil {
			t.Fatalf("Parse(%q): %v", doc, err)
		}
		if want := []string{"HTTP", "DB", "API"}; !slices.Equal(got.BaseOrder, want) {
			t.Errorf("Parse(%q).BaseOrder = %v, want %v", doc, got.BaseOrder, want)
		}
		if ordered := OrderPorts(got.BaseOrder, []string{"API", "OLD", "DB", "HTTP", "ALSO"}); !slices.Equal(ordered, []string{"HTTP", "DB", "API", "ALSO", "OLD"}) {
			t.Errorf("OrderPorts = %v: want the declared order, then undeclared keys sorted", ordered)
		}
	}
}
