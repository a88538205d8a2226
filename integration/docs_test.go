package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// docExample is one ```console block of a page: the commands, each with the output it shows.
type docExample struct {
	line  int // the block's first line in the page, for messages
	steps []docStep
}

type docStep struct {
	command string   // "$ " lines, joined with the "> " continuation lines that follow
	want    []string // the output lines shown after it
}

// docExamples parses the ```console blocks of a page: "$ cmd" starts a command, "> more" continues
// it (a heredoc's lines), every other line is output the command shows.
func docExamples(page string) []docExample {
	var examples []docExample
	var cur *docExample
	for i, line := range strings.Split(page, "\n") {
		switch {
		case cur == nil && strings.TrimSpace(line) == "```console":
			examples = append(examples, docExample{line: i + 1})
			cur = &examples[len(examples)-1]
		case cur == nil:
		case strings.HasPrefix(line, "```"):
			cur = nil
		case strings.HasPrefix(line, "$ "):
			cur.steps = append(cur.steps, docStep{command: line[2:]})
		case strings.HasPrefix(line, "> ") && len(cur.steps) > 0 && len(cur.steps[len(cur.steps)-1].want) == 0:
			cur.steps[len(cur.steps)-1].command += "\n" + line[2:]
		case len(cur.steps) > 0:
			cur.steps[len(cur.steps)-1].want = append(cur.steps[len(cur.steps)-1].want, line)
		}
	}
	return examples
}

// docLineMatches reports whether got matches a shown line, in which "…" stands for any text.
func docLineMatches(want, got string) bool {
	parts := strings.Split(want, "…")
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	return regexp.MustCompile("^" + strings.Join(parts, ".*") + "$").MatchString(got)
}

// docOutputMatches matches output lines against shown lines; a shown line of just "…" stands for
// any number of lines.
func docOutputMatches(want, got []string) bool {
	if len(want) == 0 {
		return len(got) == 0
	}
	if want[0] == "…" {
		for i := 0; i <= len(got); i++ {
			if docOutputMatches(want[1:], got[i:]) {
				return true
			}
		}
		return false
	}
	return len(got) > 0 && docLineMatches(want[0], got[0]) && docOutputMatches(want[1:], got[1:])
}

func TestDocOutputMatching(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		want, got string
		ok        bool
	}{
		{"a\nb", "a\nb", true},
		{"a\nb", "a\nc", false},
		{"a", "a\nb", false},
		{"x…z", "xyyz", true},
		{"x…z", "xyy", false},
		{"a\n…\nd", "a\nb\nc\nd", true},
		{"a\n…\nd", "a\nd", true},
		{"a\n…\nd", "a\nb", false},
		{"", "", true},
		{"", "a", false},
	} {
		split := func(s string) []string {
			if s == "" {
				return nil
			}
			return strings.Split(s, "\n")
		}
		if got := docOutputMatches(split(c.want), split(c.got)); got != c.ok {
			t.Errorf("want %q against %q: %v, expected %v", c.want, c.got, got, c.ok)
		}
	}
	ex := docExamples("text\n```console\n$ cat > f <<EOF\n> a\n> EOF\n$ cat f\na\n> b\n```\n")
	if len(ex) != 1 || len(ex[0].steps) != 2 || ex[0].steps[0].command != "cat > f <<EOF\na\nEOF" ||
		strings.Join(ex[0].steps[1].want, "|") != "a|> b" {
		t.Fatalf("parsed %+v", ex)
	}
}

// Every console example of docs/ runs as shown: each block in one bash on a fresh mount.
func TestDocsExamples(t *testing.T) {
	t.Parallel()
	pages, err := filepath.Glob("../docs/*.md")
	if err != nil || len(pages) == 0 {
		t.Fatalf("no pages in docs/: %v", err)
	}
	for _, page := range pages {
		data, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, ex := range docExamples(string(data)) {
			t.Run(fmt.Sprintf("%s:%d", filepath.Base(page), ex.line), func(t *testing.T) {
				t.Parallel()
				m := newMount(t)
				sh := m.shell(t.TempDir())
				sh.run("export LC_ALL=C PATH=" + filepath.Dir(binary) + ":$PATH")
				for _, step := range ex.steps {
					got := sh.runBlock(step.command)
					lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
					if got == "" {
						lines = nil
					}
					if !docOutputMatches(step.want, lines) {
						t.Fatalf("%s line %d: $ %s\nshows:\n%s\nwant:\n%s", page, ex.line, step.command, got, strings.Join(step.want, "\n"))
					}
				}
			})
		}
	}
}

// runBlock runs a command of any number of lines (a heredoc included) in the shell and returns
// its output, stdout and stderr together.
func (s *shell) runBlock(command string) string {
	s.t.Helper()
	return s.run("{\n" + command + "\n}")
}

var markdownLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// The README and docs link only inside the repository (a clone has nothing beside it) or to the
// web, and every relative link names a file or directory that exists.
func TestDocsLinks(t *testing.T) {
	t.Parallel()
	pages, _ := filepath.Glob("../docs/*.md")
	pages = append(pages, "../README.md")
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	for _, page := range pages {
		data, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, match := range markdownLink.FindAllStringSubmatch(string(data), -1) {
			link := match[1]
			if strings.HasPrefix(link, "https://") || strings.HasPrefix(link, "http://") || strings.HasPrefix(link, "#") {
				continue
			}
			target, _, _ := strings.Cut(link, "#")
			abs, err := filepath.Abs(filepath.Join(filepath.Dir(page), target))
			if err != nil {
				t.Fatal(err)
			}
			if abs != root && !strings.HasPrefix(abs, root+string(filepath.Separator)) {
				t.Errorf("%s links %s, outside the repository", page, link)
				continue
			}
			if _, err := os.Stat(abs); err != nil {
				t.Errorf("%s links %s: %v", page, link, err)
			}
		}
	}
}

// readmeBlock returns the first ```sh block after the README heading.
func readmeBlock(t *testing.T, heading string) string {
	t.Helper()
	data, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(data), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("README has no %q", heading)
	}
	_, after, ok = strings.Cut(after, "```sh\n")
	block, _, ok2 := strings.Cut(after, "\n```")
	if !ok || !ok2 {
		t.Fatalf("README: no ```sh block after %q", heading)
	}
	return block
}

// The README's tour runs as written on a fresh machine: a new HOME with the mount at ~/cockpit,
// nothing else made beforehand. Every command succeeds except the ones its comment says are
// refused, which print that errno.
func TestReadmeTour(t *testing.T) {
	t.Parallel()
	block := readmeBlock(t, "## Two minutes in a shell")
	home := t.TempDir()
	m := &mount{t: t, ns: ownNetns(t), Dir: filepath.Join(home, "cockpit"), Data: filepath.Join(home, "data")}
	m.start()
	t.Cleanup(m.stop)

	refusals := regexp.MustCompile(`refused \((E[A-Z]+)\)`).FindAllStringSubmatch(block, -1)
	if len(refusals) == 0 {
		t.Fatal("the tour shows no refusal; this test expects the EBUSY of the last holder's rm")
	}
	r := shIn(t, t.TempDir(), block, "HOME="+home)
	var failed []string
	for _, line := range strings.Split(strings.TrimSpace(r.Stderr), "\n") {
		if line != "" {
			failed = append(failed, line)
		}
	}
	if len(failed) != len(refusals) {
		t.Fatalf("the tour printed %d errors, its comments promise %d refusals:\n%s\nstdout:\n%s", len(failed), len(refusals), r.Stderr, r.Stdout)
	}
	for i, ref := range refusals {
		if want := map[string]string{"EBUSY": "Device or resource busy"}[ref[1]]; want == "" || !strings.Contains(failed[i], want) {
			t.Errorf("refusal %d: %q, want %s", i, failed[i], ref[1])
		}
	}
	if !strings.Contains(r.Stdout, "state=live") || !strings.Contains(r.Stdout, `"code":"CLAIM_CO_TENANT"`) {
		t.Fatalf("the tour's output misses what its comments promise:\n%s", r.Stdout)
	}
	if _, err := os.Stat(filepath.Join(home, "src", "app-feature-x")); err != nil {
		t.Fatalf("the tour's checkout: %v", err)
	}
}
