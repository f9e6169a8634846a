// The sandbox ("pause") process of the pods that tests/daemonset_kubelet.rs runs
// under a real kubelet: it holds the pod's namespaces and waits for SIGTERM or
// SIGINT. Static (CGO_ENABLED=0), so its image holds this one file.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
}
