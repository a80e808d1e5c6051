package main

import (
	"context"
	"fmt"

	"k8s.io/apiextensions-apiserver/pkg/apihelpers"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	schemaobjectmeta "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/objectmeta"
	structuralpruning "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apiextensions-apiserver/pkg/crdserverscheme"
	"k8s.io/apiextensions-apiserver/pkg/registry/customresource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	serializerjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/apiserver/pkg/storage/names"
	"k8s.io/apiserver/pkg/warning"
)

// The API server decodes custom resource bodies with this serializer (into Unstructured);
// in strict mode it reports duplicate fields as a StrictDecodingError.
var objDecoder = serializerjson.NewSerializerWithOptions(serializerjson.DefaultMetaFactory, scheme,
	crdserverscheme.NewUnstructuredObjectTyper(), serializerjson.SerializerOptions{Yaml: true, Strict: true})

type objectOptions struct {
	fieldValidation fieldValidation
	keepStatus      bool
}

// objectResult is one output line of `crdcheck objects`.
type objectResult struct {
	File     string   `json:"file"`
	Index    int      `json:"index"`
	Kind     string   `json:"kind"`
	Name     string   `json:"name"`
	Errors   []string `json:"errors"`
	Warnings []string `json:"warnings"`
}

type registry struct {
	crds     map[schema.GroupKind]*crdDoc
	versions map[schema.GroupVersionKind]*versionHandler
}

// versionHandler holds what the API server builds per served CRD version
// (see crdHandler.getOrCreateServingInfoFor in apiextensions-apiserver).
type versionHandler struct {
	crd        *apiextensionsv1.CustomResourceDefinition
	structural *structuralschema.Structural // nil when the version has no schema
	strategy   rest.RESTCreateStrategy
}

func newRegistry(crdFiles []string) (*registry, error) {
	r := &registry{crds: map[schema.GroupKind]*crdDoc{}, versions: map[schema.GroupVersionKind]*versionHandler{}}
	for _, file := range crdFiles {
		crds, err := loadCRDFile(file)
		if err != nil {
			return nil, err
		}
		for _, c := range crds {
			// The CRD must be one the API server accepts (unknown fields are ignored, as a server in
			// Warn/Ignore mode would drop them).
			if res := c.validate(fvIgnore); len(res.errors) > 0 {
				return nil, fail("%s: CRD %s is invalid (run `crdcheck crds %s`): %s", file, c.name(), file, res.errors[0])
			}
			gk := schema.GroupKind{Group: c.stored.Spec.Group, Kind: c.stored.Spec.Names.Kind}
			if prev, ok := r.crds[gk]; ok {
				return nil, fail("%s: CRD %s: kind %s is already defined by CRD %s in %s", file, c.name(), gk, prev.name(), prev.file)
			}
			r.crds[gk] = c
		}
	}
	return r, nil
}

func (r *registry) handlerFor(gvk schema.GroupVersionKind) (*versionHandler, error) {
	if h, ok := r.versions[gvk]; ok {
		return h, nil
	}
	c, ok := r.crds[gvk.GroupKind()]
	if !ok {
		return nil, fmt.Errorf("no CRD given for kind %q in group %q", gvk.Kind, gvk.Group)
	}
	crd := c.stored
	served := false
	for _, v := range crd.Spec.Versions {
		if v.Name == gvk.Version && v.Served {
			served = true
		}
	}
	if !served {
		return nil, fmt.Errorf("CRD %s does not serve version %q", crd.Name, gvk.Version)
	}

	h := &versionHandler{crd: crd}
	validationSchema, err := apihelpers.GetSchemaForVersion(crd, gvk.Version)
	if err != nil {
		return nil, err
	}
	var internalValidation *apiextensions.CustomResourceValidation
	var internalSchemaProps *apiextensions.JSONSchemaProps
	if validationSchema != nil {
		internalValidation = &apiextensions.CustomResourceValidation{}
		if err := apiextensionsv1.Convert_v1_CustomResourceValidation_To_apiextensions_CustomResourceValidation(validationSchema, internalValidation, nil); err != nil {
			return nil, fmt.Errorf("converting CRD validation to internal version: %w", err)
		}
		internalSchemaProps = internalValidation.OpenAPIV3Schema
		s, err := structuralschema.NewStructural(internalSchemaProps)
		if err != nil && !crd.Spec.PreserveUnknownFields {
			return nil, fmt.Errorf("CRD %s: schema is not structural: %w", crd.Name, err)
		}
		if !crd.Spec.PreserveUnknownFields {
			s = s.DeepCopy()
			if err := structuraldefaulting.PruneDefaults(s); err != nil {
				return nil, fmt.Errorf("CRD %s: pruning defaults: %w", crd.Name, err)
			}
		}
		h.structural = s
	}
	validator, _, err := apiservervalidation.NewSchemaValidator(internalSchemaProps)
	if err != nil {
		return nil, fmt.Errorf("CRD %s: building schema validator: %w", crd.Name, err)
	}

	subresources, err := apihelpers.GetSubresourcesForVersion(crd, gvk.Version)
	if err != nil {
		return nil, err
	}
	var statusSpec *apiextensions.CustomResourceSubresourceStatus
	var statusValidator apiservervalidation.SchemaValidator
	if subresources != nil && subresources.Status != nil {
		statusSpec = &apiextensions.CustomResourceSubresourceStatus{}
		if err := apiextensionsv1.Convert_v1_CustomResourceSubresourceStatus_To_apiextensions_CustomResourceSubresourceStatus(subresources.Status, statusSpec, nil); err != nil {
			return nil, err
		}
		if internalSchemaProps != nil && internalSchemaProps.Properties != nil {
			if statusSchema, ok := internalSchemaProps.Properties["status"]; ok {
				if statusValidator, _, err = apiservervalidation.NewSchemaValidator(&statusSchema); err != nil {
					return nil, err
				}
			}
		}
	}
	var scaleSpec *apiextensions.CustomResourceSubresourceScale
	if subresources != nil && subresources.Scale != nil {
		scaleSpec = &apiextensions.CustomResourceSubresourceScale{}
		if err := apiextensionsv1.Convert_v1_CustomResourceSubresourceScale_To_apiextensions_CustomResourceSubresourceScale(subresources.Scale, scaleSpec, nil); err != nil {
			return nil, err
		}
	}
	var selectableFields []apiextensionsv1.SelectableField
	for _, v := range crd.Spec.Versions {
		if v.Name == gvk.Version {
			selectableFields = v.SelectableFields
		}
	}
	// NewStrategy compiles the CEL rules (cel.NewValidator with celconfig.PerCallLimit); its
	// Validate runs apiservervalidation.ValidateCustomResource, embedded-ObjectMeta and list-type
	// checks, and then CEL (cel.Validator.Validate with celconfig.RuntimeCELCostBudget) unless
	// a blocking error was already found, exactly as on the server.
	h.strategy = customresource.NewStrategy(
		crdserverscheme.NewUnstructuredObjectTyper(),
		crd.Spec.Scope == apiextensionsv1.NamespaceScoped,
		gvk,
		validator,
		statusValidator,
		h.structural,
		statusSpec,
		scaleSpec,
		selectableFields,
	)
	r.versions[gvk] = h
	return h, nil
}

func (r *registry) validateFile(file string, opts objectOptions) ([]objectResult, error) {
	docs, err := readDocuments(file)
	if err != nil {
		return nil, err
	}
	var out []objectResult
	for _, d := range docs {
		gv, err := schema.ParseGroupVersion(d.meta.APIVersion)
		if err != nil || d.meta.Kind == "" || d.meta.APIVersion == "" {
			return nil, fail("%s: document %d: missing or invalid apiVersion/kind (apiVersion %q, kind %q)", file, d.index, d.meta.APIVersion, d.meta.Kind)
		}
		h, err := r.handlerFor(gv.WithKind(d.meta.Kind))
		if err != nil {
			return nil, fail("%s: document %d: %v", file, d.index, err)
		}
		res, err := h.validate(d.raw, opts)
		if err != nil {
			return nil, fail("%s: document %d: %v", file, d.index, err)
		}
		res.File, res.Index, res.Kind = file, d.index, d.meta.Kind
		out = append(out, res)
	}
	return out, nil
}

// validate runs the create path of the API server for one object:
// decode (strict) → prune unknown fields and coerce ObjectMeta → structural defaulting →
// system fields / generateName → rest.BeforeCreate (namespace check, PrepareForCreate,
// strategy Validate incl. OpenAPI schema and CEL validation, ObjectMeta validation, warnings).
func (h *versionHandler) validate(raw []byte, opts objectOptions) (objectResult, error) {
	res := objectResult{Errors: []string{}, Warnings: []string{}}
	obj, _, err := objDecoder.Decode(raw, nil, &unstructured.Unstructured{})
	var strict []string
	if err != nil {
		se, ok := runtime.AsStrictDecodingError(err)
		if !ok || obj == nil {
			return res, fmt.Errorf("decoding: %w", err)
		}
		for _, e := range se.Errors() {
			strict = append(strict, e.Error())
		}
	}
	u := obj.(*unstructured.Unstructured)
	res.Name = u.GetName()
	if res.Name == "" && u.GetGenerateName() != "" {
		res.Name = u.GetGenerateName()
	}

	unknown, err := h.coerce(u)
	if err != nil {
		// The API server answers 400 Bad Request here, before any validation.
		res.Errors = append(res.Errors, err.Error())
		return res, nil
	}
	for _, p := range unknown {
		strict = append(strict, fmt.Sprintf("unknown field %q", p))
	}
	switch opts.fieldValidation {
	case fvStrict:
		res.Errors = append(res.Errors, strict...)
	case fvWarn:
		res.Warnings = append(res.Warnings, strict...)
	}

	if h.structural != nil {
		structuraldefaulting.Default(u.Object, h.structural)
	}

	// What genericregistry.Store.Create does before BeforeCreate.
	rest.FillObjectMetaSystemFields(u)
	if u.GetGenerateName() != "" && u.GetName() == "" {
		u.SetName(names.SimpleNameGenerator.GenerateName(u.GetGenerateName()))
	}
	ns := metav1.NamespaceNone
	if h.crd.Spec.Scope == apiextensionsv1.NamespaceScoped {
		// kubectl and client libraries send the object's namespace (or the default one) in the URL.
		ns = u.GetNamespace()
		if ns == "" {
			ns = metav1.NamespaceDefault
		}
	}
	rec := &warningRecorder{}
	ctx := warning.WithWarningRecorder(genericapirequest.WithNamespace(context.Background(), ns), rec)
	strategy := h.strategy
	if opts.keepStatus {
		strategy = keepStatusStrategy{strategy}
	}
	res.Errors = append(res.Errors, statusErrorLines(rest.BeforeCreate(strategy, ctx, u))...)
	res.Warnings = append(res.Warnings, rec.warnings...)
	return res, nil
}

// coerce is unstructuredSchemaCoercer.apply of the API server's request decoder
// (apiextensions-apiserver/pkg/apiserver/customresource_handler.go) with
// returnUnknownFieldPaths=true and dropInvalidMetadata=false.
func (h *versionHandler) coerce(u *unstructured.Unstructured) (unknownFieldPaths []string, err error) {
	kind, foundKind, err := unstructured.NestedString(u.UnstructuredContent(), "kind")
	if err != nil {
		return nil, err
	}
	apiVersion, foundAPIVersion, err := unstructured.NestedString(u.UnstructuredContent(), "apiVersion")
	if err != nil {
		return nil, err
	}
	objectMeta, foundObjectMeta, metaUnknownFields, err := schemaobjectmeta.GetObjectMetaWithOptions(u.Object, schemaobjectmeta.ObjectMetaOptions{
		ReturnUnknownFieldPaths: true,
	})
	if err != nil {
		return nil, err
	}
	unknownFieldPaths = append(unknownFieldPaths, metaUnknownFields...)
	if h.structural != nil {
		if !h.crd.Spec.PreserveUnknownFields {
			unknownFieldPaths = append(unknownFieldPaths, structuralpruning.PruneWithOptions(u.Object, h.structural, true,
				structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true})...)
			structuraldefaulting.PruneNonNullableNullsWithoutDefaults(u.Object, h.structural)
		}
		ferr, paths := schemaobjectmeta.CoerceWithOptions(nil, u.Object, h.structural, false, schemaobjectmeta.CoerceOptions{
			ReturnUnknownFieldPaths: true,
		})
		if ferr != nil {
			return nil, ferr
		}
		unknownFieldPaths = append(unknownFieldPaths, paths...)
	}
	if foundKind {
		u.SetKind(kind)
	}
	if foundAPIVersion {
		u.SetAPIVersion(apiVersion)
	}
	if foundObjectMeta {
		if err := schemaobjectmeta.SetObjectMeta(u.Object, objectMeta); err != nil {
			return nil, err
		}
	}
	return unknownFieldPaths, nil
}

// keepStatusStrategy skips the status removal of PrepareForCreate (--keep-status).
type keepStatusStrategy struct{ rest.RESTCreateStrategy }

func (s keepStatusStrategy) PrepareForCreate(ctx context.Context, obj runtime.Object) {
	u := obj.(*unstructured.Unstructured)
	status, hasStatus := u.Object["status"]
	s.RESTCreateStrategy.PrepareForCreate(ctx, obj)
	if hasStatus {
		u.Object["status"] = status
	}
}
