package idempotency

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// The package's files in layers that only point down (STYLE.md: framework glue ->
// request runner -> protocol): a file uses package-level names of its own layer
// or of layers below it, never of a layer above. A new file must be placed here.
var fileLayers = map[string]int{
	// The protocol: problem types, stored responses, keys, settings, errors.
	"protocol_gen.go": 0, "http.go": 0, "common.go": 0, "route.go": 0, "fault.go": 0,
	// The runners: a request's transaction, batches, the queue, leases.
	"transactional.go": 1, "settle.go": 1, "tx.go": 1, "batch.go": 1, "queue.go": 1,
	"lease.go": 1, "lease_run.go": 1,
	// The glue: net/http, streams, Citus routing.
	"middleware.go": 2, "stream.go": 2, "router.go": 2,
}

func TestFilesOnlyPointDown(t *testing.T) {
	fset := token.NewFileSet()
	paths, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]*ast.File{}
	definedIn := map[string]string{} // package-level name -> file
	for _, path := range paths {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		if _, placed := fileLayers[path]; !placed {
			t.Errorf("%s has no layer in fileLayers", path)
		}
		file, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files[path] = file
		for name, object := range file.Scope.Objects {
			if name != "_" && object.Kind != ast.Bad {
				definedIn[name] = path
			}
		}
		for _, decl := range file.Decls { // functions are not in the file scope
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Recv == nil {
				definedIn[fn.Name.Name] = path
			}
		}
	}
	var upward []string
	for path, file := range files {
		skip := map[*ast.Ident]bool{} // field and method names, keys of literals
		ast.Inspect(file, func(node ast.Node) bool {
			switch n := node.(type) {
			case *ast.SelectorExpr:
				skip[n.Sel] = true
			case *ast.KeyValueExpr:
				if key, ok := n.Key.(*ast.Ident); ok {
					skip[key] = true
				}
			case *ast.Field:
				for _, name := range n.Names {
					skip[name] = true
				}
			case *ast.Ident:
				from, defined := definedIn[n.Name]
				if defined && !skip[n] && from != path && fileLayers[from] > fileLayers[path] {
					upward = append(upward, path+" uses "+n.Name+" of "+from)
				}
			}
			return true
		})
	}
	sort.Strings(upward)
	for _, use := range upward {
		t.Error(use)
	}
}
