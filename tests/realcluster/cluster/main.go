// Command cluster is one multi-call binary holding every Kubernetes process the real-cluster lane runs:
// embedded etcd, kube-apiserver, kube-controller-manager, kube-scheduler, the kubelet and a fake GPU device
// plugin, and kubectl to apply manifests. One binary because the components share most of their packages: linking them once keeps a cold CI
// build to a single compile of k8s.io/kubernetes. The first argument names the component; the rest are its
// own flags, exactly as the upstream binary takes them.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
	_ "time/tzdata"
)

var components = map[string]func() *cobra.Command{
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
	"kubelet":                 func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) },
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	name := os.Args[1]
	switch name {
	case "etcd":
		os.Exit(runEtcd(os.Args[2:]))
	case "gpu-device-plugin":
		os.Exit(runDevicePlugin(os.Args[2:]))
	}
	// Each component reads os.Args as its own binary would: drop the multi-call binary's name.
	os.Args = os.Args[1:]
	if name == "kubectl" {
		if err := cli.RunNoErrOutput(kubectl.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err)
		}
		os.Exit(0)
	}
	build, ok := components[name]
	if !ok {
		usage()
	}
	os.Exit(cli.Run(build()))
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: cluster etcd|kube-apiserver|kubectl|kube-controller-manager|kube-scheduler|kubelet|gpu-device-plugin [flags]")
	os.Exit(2)
}
