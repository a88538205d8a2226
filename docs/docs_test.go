// Package docs holds no code: its test keeps the pages beside it true to the code they name.
package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

var (
	backticked = regexp.MustCompile("`([^`\n]+)`")
	// goName is an identifier, or a receiver or package and what it declares: `applyStep`,
	// `commitLog.sequence`, `engine.Claim`.
	goName   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$`)
	testName = regexp.MustCompile("`((Test|Benchmark|Fuzz)[A-Z][A-Za-z0-9_]*)")
)

// declared is every name the module's Go declares: packages, functions, methods and interface
// methods (also as Recv.Name), types, fields (also as Type.Field), vars and consts (also as
// pkg.Name), and every string literal; inDir is the same per directory (a package).
type declared struct {
	names   map[string]bool
	inDir   map[string]map[string]bool
	strings map[string]bool
}

func scan(t *testing.T, root string) declared {
	d := declared{names: map[string]bool{}, inDir: map[string]map[string]bool{}, strings: map[string]bool{}}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() && (strings.HasPrefix(e.Name(), ".") || e.Name() == "node_modules" || e.Name() == "testdata") && path != root {
			return filepath.SkipDir
		}
		if e.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		pkg := f.Name.Name
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		dir := d.inDir[rel]
		if dir == nil {
			dir = map[string]bool{}
			d.inDir[rel] = dir
		}
		d.names[pkg] = true
		add := func(owner, name string) {
			d.names[name], dir[name] = true, true
			if owner != "" {
				d.names[owner+"."+name], dir[owner+"."+name] = true, true
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncDecl:
				owner := pkg
				if n.Recv != nil && len(n.Recv.List) == 1 {
					owner = receiverName(n.Recv.List[0].Type)
				}
				add(owner, n.Name.Name)
			case *ast.TypeSpec:
				add(pkg, n.Name.Name)
				var members *ast.FieldList
				switch typ := n.Type.(type) {
				case *ast.StructType:
					members = typ.Fields
				case *ast.InterfaceType:
					members = typ.Methods
				}
				if members != nil {
					for _, field := range members.List {
						for _, name := range field.Names {
							add(n.Name.Name, name.Name)
						}
					}
				}
			case *ast.ValueSpec:
				for _, name := range n.Names {
					add(pkg, name.Name)
				}
			case *ast.BasicLit:
				if n.Kind == token.STRING {
					d.strings[strings.Trim(n.Value, "`\"")] = true
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func receiverName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return receiverName(e.X)
	case *ast.IndexExpr:
		return receiverName(e.X)
	case *ast.IndexListExpr:
		return receiverName(e.X)
	case *ast.Ident:
		return e.Name
	}
	return ""
}

// TestArchitectureNamesExist: every file, directory and Go name architecture.md gives in
// backticks exists, so the page cannot drift from the code without this failing. A `.go` file
// is looked for under the package a section is about ("engine/", "fs/") and from the root; a
// name after a file on the same line is declared in that file's package ("`kv/kv.go` `Update`"),
// unless it names its package ("`engine.Claim`" is looked for as engine's).
func TestArchitectureNamesExist(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile("architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	d := scan(t, root)
	section := ""
	sectionStart := regexp.MustCompile(`^([a-z]+)/[,:]`)
	checked := 0
	for i, line := range strings.Split(string(page), "\n") {
		if m := sectionStart.FindStringSubmatch(line); m != nil {
			section = m[1]
		}
		if strings.HasPrefix(line, "#") {
			section = ""
		}
		fileDir := "" // the package of the last file named on this line
		for _, m := range backticked.FindAllStringSubmatch(line, -1) {
			tok := m[1]
			where := func() string { return "architecture.md:" + strconv.Itoa(i+1) + ": `" + tok + "`" }
			switch {
			case strings.HasSuffix(tok, ".go"):
				checked++
				switch {
				case exists(filepath.Join(root, tok)):
					fileDir = filepath.Dir(tok)
				case section != "" && exists(filepath.Join(root, section, tok)):
					fileDir = filepath.Join(section, filepath.Dir(tok))
				default:
					t.Errorf("%s: no such file", where())
				}
			case strings.Contains(tok, "/") && !strings.HasPrefix(tok, "/") && !strings.ContainsAny(tok, " $<>{}"):
				// a path of the repository (an absolute one is the machine's: /proc/…)
				checked++
				if !exists(filepath.Join(root, tok)) {
					t.Errorf("%s: no such directory", where())
				}
			case goName.MatchString(tok):
				checked++
				scope, name := d.names, tok
				if pkg, member, ok := strings.Cut(tok, "."); ok && d.inDir[pkgDir(d, pkg)] != nil {
					scope, name = d.inDir[pkgDir(d, pkg)], member
				} else if fileDir != "" {
					scope = d.inDir[fileDir]
				}
				if !scope[name] && !d.strings[tok] {
					t.Errorf("%s: not declared where the page says (%s)", where(), or(fileDir, "the module"))
				}
			}
		}
	}
	if checked < 50 {
		t.Fatalf("checked only %d names: the page's shape changed under this test", checked)
	}
}

// TestDocsNameTestsThatExist: a test or benchmark a docs page (or the README) cites as proof
// exists.
func TestDocsNameTestsThatExist(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	d := scan(t, root)
	pages, _ := filepath.Glob("*.md")
	pages = append(pages, filepath.Join(root, "README.md"))
	for _, p := range pages {
		text, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range testName.FindAllStringSubmatch(string(text), -1) {
			if !d.names[m[1]] {
				t.Errorf("%s names %s, which no test declares", filepath.Base(p), m[1])
			}
		}
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// pkgDir is the directory of the module's one package called pkg, or "" when none or several are.
func pkgDir(d declared, pkg string) string {
	found := ""
	for dir := range d.inDir {
		if filepath.Base(dir) == pkg {
			if found != "" {
				return ""
			}
			found = dir
		}
	}
	return found
}

func or(s, otherwise string) string {
	if s == "" {
		return otherwise
	}
	return s
}
