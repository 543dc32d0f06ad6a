package podcontract_test

import (
	"go/ast"
	"go/parser"
	"go/scanner"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sandman-dev/sandman/internal/depstest"
)

// TestLeaf: the package imports nothing outside the standard library, so
// any component (and a trainer's code) may import it.
func TestLeaf(t *testing.T) {
	for _, pkg := range depstest.NonStandard(t) {
		if pkg != "github.com/sandman-dev/sandman/podcontract" {
			t.Errorf("podcontract depends on %s: it must import only the standard library", pkg)
		}
	}
}

// contract is every constant of the package: value → name.
func contract(t *testing.T) map[string]string {
	t.Helper()
	paths, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	names := map[string]string{}
	for _, path := range paths {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, s := range g.Specs {
				vs := s.(*ast.ValueSpec)
				for i, n := range vs.Names {
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						t.Fatalf("%s: want a string literal", n.Name)
					}
					v, _ := strconv.Unquote(lit.Value)
					if other, dup := names[v]; dup {
						t.Errorf("%s and %s are both %q: one name per value", other, n.Name, v)
					}
					names[v] = n.Name
				}
			}
		}
	}
	if len(names) == 0 {
		t.Fatal("no constants found")
	}
	return names
}

// TestDefinedOnce: no Go file of the module outside this package (tests
// aside, which may pin the wire values) spells a label or annotation of
// the contract as a literal: it uses the constant.
func TestDefinedOnce(t *testing.T) {
	names := contract(t)
	keys := map[string]string{}
	for v, n := range names {
		// Reasons and condition types are ordinary words; the names with a
		// domain are what a copy would spell.
		if strings.Contains(v, "/") {
			keys[v] = n
		}
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Skipf("no module root above the package: %v", err)
	}
	var found []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel == "podcontract" || strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules" {
				return filepath.SkipDir
			}
			if rel != "." {
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir // another module
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		fset := token.NewFileSet()
		file := fset.AddFile(path, -1, len(src))
		var s scanner.Scanner
		s.Init(file, src, nil, 0)
		for {
			pos, tok, lit := s.Scan()
			if tok == token.EOF {
				break
			}
			if tok != token.STRING {
				continue
			}
			if v, err := strconv.Unquote(lit); err == nil && keys[v] != "" {
				found = append(found, fset.Position(pos).String()+": "+lit+" (podcontract."+keys[v]+")")
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range found {
		t.Errorf("%s: a literal of the pod contract; use the constant", strings.TrimPrefix(f, root+string(filepath.Separator)))
	}
}
