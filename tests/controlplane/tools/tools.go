//go:build tools

// Package tools pins the control plane's companions, kwok and helm, which build.sh builds from
// this module (`go build sigs.k8s.io/kwok/cmd/kwok`, `go build helm.sh/helm/v3/cmd/helm`). Every
// module they share with the control plane is at the control plane's version (../go.mod, its
// replacements copied here), so a cold build compiles only what the control plane does not:
// kwok and helm each took about five minutes cold with their own module graphs
// (`go install ...@version`), against a minute or so here after the control plane.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
