package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// document is one non-empty YAML document of a file.
type document struct {
	index int    // 0-based, counting non-empty documents only
	raw   []byte // the YAML (or JSON) text of the document
	meta  metav1.TypeMeta
}

// readDocuments splits a multi-document YAML (or JSON) file, skipping
// documents that hold only whitespace, comments or null.
func readDocuments(file string) ([]document, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fail("%v", err)
	}
	defer f.Close()
	r := utilyaml.NewYAMLReader(bufio.NewReader(f))
	var docs []document
	for {
		raw, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fail("%s: reading YAML: %v", file, err)
		}
		j, err := yaml.YAMLToJSON(raw)
		if err != nil {
			return nil, fail("%s: document %d: invalid YAML: %v", file, len(docs), err)
		}
		if t := bytes.TrimSpace(j); len(t) == 0 || bytes.Equal(t, []byte("null")) {
			continue
		}
		d := document{index: len(docs), raw: raw}
		if err := json.Unmarshal(j, &d.meta); err != nil {
			return nil, fail("%s: document %d: not a Kubernetes object: %v", file, d.index, err)
		}
		docs = append(docs, d)
	}
	return docs, nil
}

func writeJSONLine(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	_, err = w.Write(b)
	return err
}
