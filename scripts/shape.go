//go:build ignore

// shape prints the module's shape, for issue notes that compare before and
// after: lines and exported names per package (tests apart), and the
// longest functions. Run from the module root: go run scripts/shape.go [N]
package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

type pkg struct {
	files, lines, testLines, exported int
}

type fn struct {
	name  string
	lines int
}

func main() {
	top := 15
	if len(os.Args) > 1 {
		top, _ = strconv.Atoi(os.Args[1])
	}
	pkgs := map[string]*pkg{}
	var fns []fn
	fset := token.NewFileSet()
	filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "tools" || d.Name() == "scripts") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		dir := filepath.Dir(path)
		p := pkgs[dir]
		if p == nil {
			p = &pkg{}
			pkgs[dir] = p
		}
		n := fset.Position(f.End()).Line
		if strings.HasSuffix(path, "_test.go") {
			p.testLines += n
			return nil
		}
		p.files++
		p.lines += n
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if d.Name.IsExported() && (d.Recv == nil || exportedRecv(d.Recv)) {
					p.exported++
				}
				name := d.Name.Name
				if d.Recv != nil {
					name = recvName(d.Recv) + "." + name
				}
				fns = append(fns, fn{dir + ": " + name, fset.Position(d.End()).Line - fset.Position(d.Pos()).Line + 1})
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							p.exported++
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								p.exported++
							}
						}
					}
				}
			}
		}
		return nil
	})
	dirs := make([]string, 0, len(pkgs))
	for d := range pkgs {
		dirs = append(dirs, d)
	}
	sort.Strings(dirs)
	fmt.Printf("| package | files | lines | exported names | test lines |\n|---|---:|---:|---:|---:|\n")
	for _, d := range dirs {
		p := pkgs[d]
		fmt.Printf("| %s | %d | %d | %d | %d |\n", d, p.files, p.lines, p.exported, p.testLines)
	}
	sort.SliceStable(fns, func(i, j int) bool { return fns[i].lines > fns[j].lines })
	fmt.Printf("\n| longest functions (non-test) | lines |\n|---|---:|\n")
	shown := 0
	for _, f := range fns {
		if shown == top {
			break
		}
		fmt.Printf("| %s | %d |\n", f.name, f.lines)
		shown++
	}
}

func recvName(l *ast.FieldList) string {
	t := l.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if g, ok := t.(*ast.IndexExpr); ok {
		t = g.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name
	}
	return "?"
}

func exportedRecv(l *ast.FieldList) bool { return ast.IsExported(recvName(l)) }
