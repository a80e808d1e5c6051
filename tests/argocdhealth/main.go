// Command argocdhealth runs Argo CD's own Lua health code (github.com/argoproj/argo-cd/v3/util/lua,
// the package the application controller calls) on health.lua scripts kept in Argo CD's
// resource_customizations layout, so the project's health checks are tested by the code that will
// run them instead of a reimplementation.
//
// Usage:
//
//	argocdhealth test DIR          run every DIR/<group>/<Kind>/health_test.yaml; exit 1 on a mismatch
//	argocdhealth eval DIR FILE...  print the health of each object in FILE (YAML, one or more documents)
//
// Both print one JSON object per line: {"kind", "file", "status", "message", "want"?, "ok"?}.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	"github.com/argoproj/argo-cd/v3/pkg/apis/application/v1alpha1"
	"github.com/argoproj/argo-cd/v3/util/lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	yamlutil "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// testFile is the shape of Argo CD's health_test.yaml.
type testFile struct {
	Tests []struct {
		HealthStatus struct {
			Status  string `json:"status"`
			Message string `json:"message"`
		} `json:"healthStatus"`
		InputPath string `json:"inputPath"`
	} `json:"tests"`
}

// result is one line of output.
type result struct {
	Kind    string `json:"kind"`
	File    string `json:"file"`
	Status  string `json:"status"`
	Message string `json:"message"`
	Want    string `json:"want,omitempty"`
	WantMsg string `json:"wantMessage,omitempty"`
	OK      *bool  `json:"ok,omitempty"`
	Error   string `json:"error,omitempty"`
}

// loadOverrides reads DIR/<group>/<Kind>/health.lua into the overrides an argocd-cm with
// resource.customizations.health.<group>_<Kind> keys turns into.
func loadOverrides(dir string) (lua.ResourceHealthOverrides, error) {
	scripts, err := filepath.Glob(filepath.Join(dir, "*", "*", "health.lua"))
	if err != nil {
		return nil, err
	}
	if len(scripts) == 0 {
		return nil, fmt.Errorf("no <group>/<Kind>/health.lua under %s", dir)
	}
	overrides := lua.ResourceHealthOverrides{}
	for _, path := range scripts {
		text, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		kindDir := filepath.Dir(path)
		key := filepath.Base(filepath.Dir(kindDir)) + "/" + filepath.Base(kindDir)
		overrides[key] = v1alpha1.ResourceOverride{HealthLua: string(text)}
	}
	return overrides, nil
}

// readObjects decodes every YAML document of a file.
func readObjects(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	decoder := yamlutil.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		obj := map[string]any{}
		if err := decoder.Decode(&obj); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(obj) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: obj})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no objects", path)
	}
	return out, nil
}

// health runs the override that matches the object's group and kind, exactly as the
// application controller does.
func health(overrides lua.ResourceHealthOverrides, obj *unstructured.Unstructured, file string) result {
	r := result{Kind: obj.GetKind(), File: file}
	status, err := overrides.GetResourceHealth(obj)
	switch {
	case err != nil:
		r.Error = err.Error()
	case status == nil:
		r.Error = fmt.Sprintf("no health check for %s", obj.GroupVersionKind().GroupKind())
	default:
		r.Status, r.Message = string(status.Status), status.Message
	}
	return r
}

func runTests(dir string, out *json.Encoder) (bool, error) {
	overrides, err := loadOverrides(dir)
	if err != nil {
		return false, err
	}
	files, err := filepath.Glob(filepath.Join(dir, "*", "*", "health_test.yaml"))
	if err != nil {
		return false, err
	}
	if len(files) != len(overrides) {
		return false, fmt.Errorf("%d health.lua but %d health_test.yaml under %s", len(overrides), len(files), dir)
	}
	sort.Strings(files)
	allOK := true
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			return false, err
		}
		var tf testFile
		if err := yaml.UnmarshalStrict(data, &tf); err != nil {
			return false, fmt.Errorf("%s: %w", file, err)
		}
		if len(tf.Tests) == 0 {
			return false, fmt.Errorf("%s: no tests", file)
		}
		for _, tc := range tf.Tests {
			input := filepath.Join(filepath.Dir(file), tc.InputPath)
			objs, err := readObjects(input)
			if err != nil {
				return false, err
			}
			if len(objs) != 1 {
				return false, fmt.Errorf("%s: want one object, found %d", input, len(objs))
			}
			r := health(overrides, objs[0], input)
			r.Want, r.WantMsg = tc.HealthStatus.Status, tc.HealthStatus.Message
			ok := r.Error == "" && r.Status == r.Want && r.Message == r.WantMsg
			r.OK = &ok
			allOK = allOK && ok
			if err := out.Encode(r); err != nil {
				return false, err
			}
		}
	}
	return allOK, nil
}

func runEval(dir string, files []string, out *json.Encoder) error {
	overrides, err := loadOverrides(dir)
	if err != nil {
		return err
	}
	for _, file := range files {
		objs, err := readObjects(file)
		if err != nil {
			return err
		}
		for _, obj := range objs {
			if err := out.Encode(health(overrides, obj, file)); err != nil {
				return err
			}
		}
	}
	return nil
}

func main() {
	out := json.NewEncoder(os.Stdout)
	args := os.Args[1:]
	var err error
	switch {
	case len(args) == 2 && args[0] == "test":
		var ok bool
		ok, err = runTests(args[1], out)
		if err == nil && !ok {
			fmt.Fprintln(os.Stderr, "argocdhealth: some health checks did not give the expected status")
			os.Exit(1)
		}
	case len(args) >= 3 && args[0] == "eval":
		err = runEval(args[1], args[2:], out)
	default:
		fmt.Fprintln(os.Stderr, "usage: argocdhealth test DIR | argocdhealth eval DIR FILE...")
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "argocdhealth:", err)
		os.Exit(1)
	}
}
