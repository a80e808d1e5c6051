package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestCRDsValid(t *testing.T) {
	code, out, errs := runCmd(t, "crds", "testdata/valid-crd.yaml")
	if code != 0 || out != "ok trainingjobs.example.com\n" {
		t.Fatalf("code=%d stdout=%q stderr=%q", code, out, errs)
	}
}

func TestCRDsInvalid(t *testing.T) {
	code, out, _ := runCmd(t, "crds", "testdata/valid-crd.yaml", "testdata/invalid-crd.yaml")
	if code != 1 {
		t.Fatalf("exit code %d, want 1; stdout:\n%s", code, out)
	}
	for _, want := range []string{
		"ok trainingjobs.example.com\n",
		"testdata/invalid-crd.yaml: refjobs.example.com: spec.validation.openAPIV3Schema.properties[spec].properties[template].$ref: Forbidden: $ref is not supported\n",
		"testdata/invalid-crd.yaml: untypedjobs.example.com: spec.validation.openAPIV3Schema.properties[spec].properties[extra].type: Required value: must not be empty for specified object fields\n",
		"testdata/invalid-crd.yaml: celjobs.example.com: spec.validation.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule: Invalid value:",
		"compilation failed: ERROR: <input>:1:17: undefined field 'nosuchfield'",
		"testdata/invalid-crd.yaml: celjobs.example.com: spec.validation.openAPIV3Schema.properties[spec].x-kubernetes-validations[1].rule: Invalid value:",
		"found no matching overload for '_+_' applied to '(int, string)'",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q; stdout:\n%s", want, out)
		}
	}
	for _, notWant := range []string{"ok refjobs", "ok untypedjobs", "ok celjobs"} {
		if strings.Contains(out, notWant) {
			t.Errorf("stdout has %q", notWant)
		}
	}
}

func TestCRDsUnknownField(t *testing.T) {
	b, err := os.ReadFile("testdata/valid-crd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "typo.yaml")
	typo := strings.Replace(string(b), "      served: true\n", "      served: true\n      servd: true\n", 1)
	if err := os.WriteFile(f, []byte(typo), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, _ := runCmd(t, "crds", f)
	if code != 1 || !strings.Contains(out, `trainingjobs.example.com: unknown field "spec.versions[0].servd"`) {
		t.Fatalf("strict: code=%d stdout=%q", code, out)
	}
	code, out, errs := runCmd(t, "crds", "--field-validation=Warn", f)
	if code != 0 || out != "ok trainingjobs.example.com\n" || !strings.Contains(errs, "warning: unknown field") {
		t.Fatalf("warn: code=%d stdout=%q stderr=%q", code, out, errs)
	}
}

func objectResults(t *testing.T, out string) []objectResult {
	t.Helper()
	var rs []objectResult
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r objectResult
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("bad JSON line %q: %v", line, err)
		}
		rs = append(rs, r)
	}
	return rs
}

func TestObjects(t *testing.T) {
	code, out, errs := runCmd(t, "objects", "--crds", "testdata/valid-crd.yaml", "testdata/objects.yaml")
	if code != 0 {
		t.Fatalf("code=%d stderr=%s", code, errs)
	}
	rs := objectResults(t, out)
	if len(rs) != 2 {
		t.Fatalf("got %d results, want 2:\n%s", len(rs), out)
	}
	good, bad := rs[0], rs[1]
	if good.Index != 0 || good.Name != "good" || good.Kind != "TrainingJob" || len(good.Errors) != 0 {
		t.Errorf("good object: %+v", good)
	}
	wantBad := []string{
		"spec.replicas: Invalid value: 12: spec.replicas in body should be less than or equal to 8",
		"spec.resources: Invalid value: gpus must be a multiple of tp (tensor-parallel size)",
	}
	if bad.Index != 1 || bad.Name != "bad" || strings.Join(bad.Errors, "\n") != strings.Join(wantBad, "\n") {
		t.Errorf("bad object: %+v\nwant errors %q", bad, wantBad)
	}
	// The output keeps "errors" as [] (not null) for valid objects.
	if !strings.Contains(out, `"errors":[]`) {
		t.Errorf("valid object line lacks \"errors\":[]: %s", out)
	}
}

// Defaulting must run before validation: without the default tp=1 the CEL
// rule of the good object would fail with "no such key: tp".
func TestObjectsDefaultingAndStrictness(t *testing.T) {
	f := filepath.Join(t.TempDir(), "o.yaml")
	doc := `apiVersion: example.com/v1alpha1
kind: TrainingJob
metadata: {generateName: gen-}
spec:
  image: img
  typo: 1
  resources: {gpus: 3}
status: {phase: Weird}
`
	if err := os.WriteFile(f, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	_, out, _ := runCmd(t, "objects", "--crds", "testdata/valid-crd.yaml", f)
	r := objectResults(t, out)[0]
	if r.Name != "gen-" || strings.Join(r.Errors, "|") != `unknown field "spec.typo"` {
		t.Errorf("strict: %+v", r)
	}
	// --keep-status validates the status; Warn turns the unknown field into a warning.
	// An Unsupported value is a "blocking" error: the server then skips CEL and says so.
	_, out, _ = runCmd(t, "objects", "--crds", "testdata/valid-crd.yaml", "--keep-status", "--field-validation=Warn", f)
	r = objectResults(t, out)[0]
	if len(r.Errors) != 2 || !strings.HasPrefix(r.Errors[0], `status.phase: Unsupported value: "Weird"`) ||
		!strings.Contains(r.Errors[1], "some validation rules were not checked") ||
		strings.Join(r.Warnings, "|") != `unknown field "spec.typo"` {
		t.Errorf("keep-status/warn: %+v", r)
	}
}

func TestObjectsProgramErrors(t *testing.T) {
	f := filepath.Join(t.TempDir(), "o.yaml")
	if err := os.WriteFile(f, []byte("apiVersion: example.com/v1alpha1\nkind: Nope\nmetadata: {name: a}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"objects", "--crds", "testdata/valid-crd.yaml", f},                         // unknown kind
		{"objects", "--crds", "testdata/invalid-crd.yaml", "testdata/objects.yaml"}, // invalid CRD
		{"objects", "testdata/objects.yaml"},                                        // no --crds
		{"objects", "--crds", "testdata/valid-crd.yaml", "testdata/nonexistent.yaml"},
		{"crds", "testdata/objects.yaml"}, // not a CRD
		{"bogus"},
	} {
		if code, out, errs := runCmd(t, args...); code != 2 || errs == "" {
			t.Errorf("%v: code=%d stdout=%q stderr=%q, want exit 2 with a message", args, code, out, errs)
		}
	}
}
