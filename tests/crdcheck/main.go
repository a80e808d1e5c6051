// Command crdcheck runs the validation that a real kube-apiserver runs on
// create, for CustomResourceDefinitions and for custom objects, without a
// running API server. It calls the apiextensions-apiserver code itself
// (registry strategies, structural schemas, defaulting, OpenAPI and CEL
// validation), so results match the pinned Kubernetes release in go.mod.
//
//	crdcheck crds [--field-validation=Strict|Warn|Ignore] FILE...
//	crdcheck objects --crds CRDFILE [--crds CRDFILE...] [--field-validation=...] [--keep-status] FILE...
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

const usage = `usage:
  crdcheck crds [--field-validation=Strict|Warn|Ignore] FILE...
      Validate apiextensions.k8s.io/v1 CustomResourceDefinitions as the API server does on create.
      Prints "FILE: CRD-NAME: field.path: message" per error (exit 1), or "ok CRD-NAME" per CRD (exit 0).
  crdcheck objects --crds CRDFILE [--crds CRDFILE...] [--field-validation=...] [--keep-status] FILE...
      Default and validate custom objects (OpenAPI schema + CEL rules) as the API server does on create.
      Prints one JSON object per document: {"file","index","kind","name","errors":[...],"warnings":[...]}.
      Exit 0 unless the program itself fails (exit 2).

--field-validation: how unknown/duplicate fields are treated (like kubectl --validate / the
  fieldValidation query parameter). Strict (default, kubectl's default): errors. Warn: warnings. Ignore: dropped.
--keep-status: do not drop .status on create when the CRD has a status subresource
  (the API server drops it; keep it to validate status content against the schema).
`

// exitError carries an exit code for failures of the program itself.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func fail(format string, args ...any) error {
	return &exitError{code: 2, err: fmt.Errorf(format, args...)}
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

type fieldValidation string

const (
	fvStrict fieldValidation = "Strict"
	fvWarn   fieldValidation = "Warn"
	fvIgnore fieldValidation = "Ignore"
)

func parseFieldValidation(s string) (fieldValidation, error) {
	switch strings.ToLower(s) {
	case "strict":
		return fvStrict, nil
	case "warn":
		return fvWarn, nil
	case "ignore":
		return fvIgnore, nil
	}
	return "", fail("invalid --field-validation %q (want Strict, Warn or Ignore)", s)
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is main without os.Exit, for tests.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var (
		code int
		err  error
	)
	switch args[0] {
	case "crds":
		code, err = runCRDs(args[1:], stdout, stderr)
	case "objects":
		code, err = runObjects(args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		err = fail("unknown subcommand %q", args[0])
	}
	if err != nil {
		var ee *exitError
		if errors.As(err, &ee) {
			code = ee.code
		} else {
			code = 2
		}
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stderr, "crdcheck: %v\n", err)
		}
		if code == 0 {
			code = 2
		}
	}
	return code
}

func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage) }
	return fs
}

func runCRDs(args []string, stdout, stderr io.Writer) (int, error) {
	fs := newFlagSet("crds", stderr)
	fv := fs.String("field-validation", "Strict", "Strict, Warn or Ignore")
	if err := fs.Parse(args); err != nil {
		return 2, &exitError{2, err}
	}
	mode, err := parseFieldValidation(*fv)
	if err != nil {
		return 2, err
	}
	if fs.NArg() == 0 {
		return 2, fail("crds: no files given")
	}
	failed := false
	for _, file := range fs.Args() {
		crds, err := loadCRDFile(file)
		if err != nil {
			return 2, err
		}
		for _, c := range crds {
			res := c.validate(mode)
			for _, w := range res.warnings {
				fmt.Fprintf(stderr, "%s: %s: warning: %s\n", file, c.name(), w)
			}
			for _, e := range res.errors {
				fmt.Fprintf(stdout, "%s: %s: %s\n", file, c.name(), e)
			}
			if len(res.errors) > 0 {
				failed = true
			} else {
				fmt.Fprintf(stdout, "ok %s\n", c.name())
			}
		}
	}
	if failed {
		return 1, nil
	}
	return 0, nil
}

func runObjects(args []string, stdout, stderr io.Writer) (int, error) {
	fs := newFlagSet("objects", stderr)
	var crdFiles multiFlag
	fs.Var(&crdFiles, "crds", "CRD file (repeatable)")
	fv := fs.String("field-validation", "Strict", "Strict, Warn or Ignore")
	keepStatus := fs.Bool("keep-status", false, "keep .status on create even with a status subresource")
	if err := fs.Parse(args); err != nil {
		return 2, &exitError{2, err}
	}
	mode, err := parseFieldValidation(*fv)
	if err != nil {
		return 2, err
	}
	if len(crdFiles) == 0 {
		return 2, fail("objects: at least one --crds file is required")
	}
	if fs.NArg() == 0 {
		return 2, fail("objects: no object files given")
	}
	reg, err := newRegistry(crdFiles)
	if err != nil {
		return 2, err
	}
	opts := objectOptions{fieldValidation: mode, keepStatus: *keepStatus}
	for _, file := range fs.Args() {
		results, err := reg.validateFile(file, opts)
		if err != nil {
			return 2, err
		}
		for _, r := range results {
			if err := writeJSONLine(stdout, r); err != nil {
				return 2, err
			}
		}
	}
	return 0, nil
}
