// Command peer runs liqoctl's peering (pkg/liqoctl/peer of the Liqo module) between two clusters with
// networking disabled: authentication, a ResourceSlice and a VirtualNode, as `liqoctl peer
// --networking-disabled` does. liqoctl itself links the cloud providers' SDKs its install command needs (AWS,
// Azure, GKE); this command links only the peering, which cuts the Liqo stage's build.
//
//	peer --kubeconfig ORIGIN --remote-kubeconfig DONOR [--cpu 4] [--memory 8Gi] [--pods 50]
//	     [--resource nvidia.com/gpu=2] [--timeout 5m]
package main

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes/scheme"

	authv1beta1 "github.com/liqotech/liqo/apis/authentication/v1beta1"
	liqov1beta1 "github.com/liqotech/liqo/apis/core/v1beta1"
	ipamv1alpha1 "github.com/liqotech/liqo/apis/ipam/v1alpha1"
	networkingv1beta1 "github.com/liqotech/liqo/apis/networking/v1beta1"
	offloadingv1beta1 "github.com/liqotech/liqo/apis/offloading/v1beta1"
	"github.com/liqotech/liqo/pkg/liqoctl/factory"
	"github.com/liqotech/liqo/pkg/liqoctl/peer"
)

// The peering's clients use client-go's scheme: Liqo's kinds must be in it (liqoctl's main registers them too).
func init() {
	utilruntime.Must(liqov1beta1.AddToScheme(scheme.Scheme))
	utilruntime.Must(offloadingv1beta1.AddToScheme(scheme.Scheme))
	utilruntime.Must(networkingv1beta1.AddToScheme(scheme.Scheme))
	utilruntime.Must(ipamv1alpha1.AddToScheme(scheme.Scheme))
	utilruntime.Must(authv1beta1.AddToScheme(scheme.Scheme))
}

func main() {
	local, remote := factory.NewForLocal(), factory.NewForRemote()
	options := peer.NewOptions(local)
	options.RemoteFactory = remote
	flags := pflag.NewFlagSet("peer", pflag.ExitOnError)
	local.AddFlags(flags, registerNothing)
	remote.AddFlags(flags, registerNothing)
	local.AddLiqoNamespaceFlag(flags)
	remote.AddLiqoNamespaceFlag(flags)
	flags.DurationVar(&options.Timeout, "timeout", 10*time.Minute, "timeout for the peering to complete")
	flags.StringVar(&options.CPU, "cpu", "", "CPU requested for the VirtualNode")
	flags.StringVar(&options.Memory, "memory", "", "memory requested for the VirtualNode")
	flags.StringVar(&options.Pods, "pods", "", "pods requested for the VirtualNode")
	flags.StringToStringVar(&options.OtherResources, "resource", nil, "other resources requested (nvidia.com/gpu=2)")
	if err := flags.Parse(os.Args[1:]); err != nil {
		fail(err)
	}
	options.NetworkingDisabled = true
	options.CreateResourceSlice = true
	options.ResourceSliceClass = "default"
	options.CreateVirtualNode = true
	if err := local.Initialize(factory.WithScopedPrinter); err != nil {
		fail(err)
	}
	if err := remote.Initialize(factory.WithScopedPrinter); err != nil {
		fail(err)
	}
	if reflect.DeepEqual(local.RESTConfig, remote.RESTConfig) {
		fail(fmt.Errorf("the local and remote kubeconfigs name the same cluster"))
	}
	if err := options.RunPeer(context.Background()); err != nil {
		fail(err)
	}
}

// registerNothing stands for cobra's completion registry: a command run by a script completes nothing.
func registerNothing(string, func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective)) error {
	return nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "peer:", err)
	os.Exit(1)
}
