// Command crl-pause is the pod sandbox's "pause" process for the real-node tests: it holds the
// pod's namespaces and does nothing until SIGTERM or SIGINT. As PID 1 of the pod's PID namespace
// (when the pod shares one) it also reaps orphans. No registry is reachable from the tests, so
// the image containerd names as its sandbox image is made from this binary (tests/node.py).
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	children := make(chan os.Signal, 1)
	signal.Notify(children, syscall.SIGCHLD)
	for {
		select {
		case <-stop:
			os.Exit(0)
		case <-children:
			for {
				pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
		}
	}
}
