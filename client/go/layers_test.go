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

// The package's files in ranks that only point down (STYLE.md: framework glue ->
// request runner -> protocol calls -> wire): a file uses package-level names of
// its own or of files of a lower rank, never of a file of its rank or above, so
// there is no circle. Method calls are not resolved here: a method lives in the
// file of the rank that calls it, or below. A new file must be placed here.
var fileLayers = map[string]int{
	// The protocol: generated names, settings per route, responses, requests, faults.
	"protocol_gen.go": 0, "route.go": 1, "http.go": 2, "common.go": 3, "fault.go": 3,
	// The wire under the runners: the statements that end a transaction, the pgx.Tx.
	"wire.go": 4, "tx.go": 4,
	// The runners: the Client, a request's transaction, batches, the queue, leases.
	"client.go": 5, "transactional.go": 6, "batch.go": 6, "queue.go": 6, "lease.go": 6,
	"lease_run.go": 7,
	// The glue: streams, Citus routing, net/http.
	"stream.go": 8, "router.go": 8, "middleware.go": 9,
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
				if defined && !skip[n] && from != path && fileLayers[from] >= fileLayers[path] {
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
