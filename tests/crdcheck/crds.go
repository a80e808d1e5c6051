package main

import (
	"context"
	"fmt"
	"sync"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/install"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	crdregistry "k8s.io/apiextensions-apiserver/pkg/registry/customresourcedefinition"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	serializerjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/apiserver/pkg/warning"
)

var (
	scheme = func() *runtime.Scheme {
		s := runtime.NewScheme()
		install.Install(s)
		return s
	}()
	// The same decoding the API server does for a YAML body with fieldValidation=Strict:
	// unknown and duplicate fields come back as a runtime.StrictDecodingError next to the object.
	crdDecoder = serializerjson.NewSerializerWithOptions(serializerjson.DefaultMetaFactory, scheme, scheme,
		serializerjson.SerializerOptions{Yaml: true, Strict: true})
)

type crdDoc struct {
	file  string
	index int
	// v1 is the CRD as decoded and defaulted (the v1 defaults the API server applies).
	v1 *apiextensionsv1.CustomResourceDefinition
	// strictErrs are unknown/duplicate field errors from strict decoding.
	strictErrs []string

	once   sync.Once
	result crdResult
	// stored is the CRD as the API server would store it after a successful create
	// (internal → v1 after PrepareForCreate); nil when invalid.
	stored *apiextensionsv1.CustomResourceDefinition
}

type crdResult struct {
	errors   []string // validation errors, "field.path: message"
	warnings []string
}

func (c *crdDoc) name() string {
	if c.v1.Name != "" {
		return c.v1.Name
	}
	return fmt.Sprintf("<document %d>", c.index)
}

func loadCRDFile(file string) ([]*crdDoc, error) {
	docs, err := readDocuments(file)
	if err != nil {
		return nil, err
	}
	var out []*crdDoc
	for _, d := range docs {
		if d.meta.APIVersion != "apiextensions.k8s.io/v1" || d.meta.Kind != "CustomResourceDefinition" {
			return nil, fail("%s: document %d: expected apiVersion apiextensions.k8s.io/v1, kind CustomResourceDefinition; got apiVersion %q, kind %q",
				file, d.index, d.meta.APIVersion, d.meta.Kind)
		}
		obj, _, err := crdDecoder.Decode(d.raw, nil, &apiextensionsv1.CustomResourceDefinition{})
		var strict []string
		if err != nil {
			se, ok := runtime.AsStrictDecodingError(err)
			if !ok || obj == nil {
				return nil, fail("%s: document %d: decoding CustomResourceDefinition: %v", file, d.index, err)
			}
			for _, e := range se.Errors() {
				strict = append(strict, e.Error())
			}
		}
		crd := obj.(*apiextensionsv1.CustomResourceDefinition)
		scheme.Default(crd) // SetObjectDefaults_CustomResourceDefinition, as the codec does on decode
		out = append(out, &crdDoc{file: file, index: d.index, v1: crd, strictErrs: strict})
	}
	return out, nil
}

// validate runs what the API server runs on CRD create: conversion to the internal
// type, rest.BeforeCreate with the CRD registry strategy (PrepareForCreate, then
// Validate = validation.ValidateCustomResourceDefinition, then generic ObjectMeta
// validation, then WarningsOnCreate).
func (c *crdDoc) validate(mode fieldValidation) crdResult {
	c.once.Do(func() { c.result = c.doValidate() })
	res := crdResult{warnings: append([]string(nil), c.result.warnings...)}
	switch mode {
	case fvStrict:
		res.errors = append(res.errors, c.strictErrs...)
	case fvWarn:
		res.warnings = append(res.warnings, c.strictErrs...)
	}
	res.errors = append(res.errors, c.result.errors...)
	return res
}

func (c *crdDoc) doValidate() crdResult {
	internal := &apiextensions.CustomResourceDefinition{}
	if err := scheme.Convert(c.v1.DeepCopy(), internal, nil); err != nil {
		return crdResult{errors: []string{fmt.Sprintf("converting to internal version: %v", err)}}
	}
	rest.FillObjectMetaSystemFields(internal)
	rec := &warningRecorder{}
	ctx := warning.WithWarningRecorder(genericapirequest.WithNamespace(context.Background(), metav1.NamespaceNone), rec)
	err := rest.BeforeCreate(crdregistry.NewStrategy(scheme), ctx, internal)
	res := crdResult{errors: statusErrorLines(err), warnings: rec.warnings}
	if len(res.errors) == 0 {
		stored := &apiextensionsv1.CustomResourceDefinition{}
		if err := scheme.Convert(internal, stored, nil); err != nil {
			res.errors = append(res.errors, fmt.Sprintf("converting back to v1: %v", err))
		} else {
			c.stored = stored
		}
	}
	return res
}

// statusErrorLines turns an API error into "field.path: message" lines, the
// same text field.Error.Error() gives for each cause of an Invalid error.
func statusErrorLines(err error) []string {
	if err == nil {
		return nil
	}
	if se, ok := err.(apierrors.APIStatus); ok {
		st := se.Status()
		if st.Reason == metav1.StatusReasonInvalid && st.Details != nil && len(st.Details.Causes) > 0 {
			var out []string
			for _, cause := range st.Details.Causes {
				if cause.Field != "" {
					out = append(out, cause.Field+": "+cause.Message)
				} else {
					out = append(out, cause.Message)
				}
			}
			return out
		}
	}
	return []string{err.Error()}
}

type warningRecorder struct{ warnings []string }

func (r *warningRecorder) AddWarning(_, text string) { r.warnings = append(r.warnings, text) }
