// Command crl-kubelet is the upstream kubelet, built from the same Kubernetes modules (and so
// the same version) as crl-controlplane. It lives in its own binary so that adding it did not
// change what crl-controlplane is built from: only the real-node tests need it, and the kubelet
// pulls in cadvisor and the container-runtime clients, which the control plane does not.
//
// tests/node.py starts it next to containerd; see docs/testing-cluster.md.
package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format, as upstream
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics, as upstream
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric, as upstream
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	os.Exit(cli.Run(kubelet.NewKubeletCommand(context.Background())))
}
