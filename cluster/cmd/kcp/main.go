// Command kcp runs one real Kubernetes control-plane component, built from upstream's own
// packages: `kcp etcd|kube-apiserver|kube-controller-manager|kube-scheduler [flags]`.
//
// Each subcommand is what upstream's own main does (cmd/<component>/<component>.go,
// server/etcdmain), nothing more: one binary keeps the build to one link of the shared code.
package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	jobcontroller "k8s.io/kubernetes/pkg/controller/job"
)

const usage = "usage: kcp etcd|kube-apiserver|kube-controller-manager|kube-scheduler [flags]"

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	name, args := os.Args[1], os.Args[2:]
	switch name {
	case "etcd":
		// etcdmain.Main reads os.Args[1:] as etcd's own flags.
		etcdmain.Main(append([]string{"etcd"}, args...))
		return
	case "kube-apiserver":
		command := apiserver.NewAPIServerCommand()
		command.SetArgs(args)
		os.Exit(cli.Run(command))
	case "kube-controller-manager":
		args, err := jobBackoff(args)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		command := controllermanager.NewControllerManagerCommand()
		command.SetArgs(args)
		os.Exit(cli.Run(command))
	case "kube-scheduler":
		command := scheduler.NewSchedulerCommand()
		command.SetArgs(args)
		os.Exit(cli.Run(command))
	default:
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
}

// jobBackoff takes our one flag of our own out of the controller manager's arguments:
// --kcp-job-pod-failure-backoff=DURATION sets the Job controller's delay before a failed
// pod's replacement (DefaultJobPodFailureBackOff, 10 s upstream, doubling up to
// MaxJobPodFailureBackOff). The variable is "exported for tests", and upstream's own
// integration tests shorten it the same way (test/integration/job: setDurationDuringTest).
func jobBackoff(args []string) ([]string, error) {
	const flag = "--kcp-job-pod-failure-backoff="
	rest := make([]string, 0, len(args))
	for _, arg := range args {
		if !strings.HasPrefix(arg, flag) {
			rest = append(rest, arg)
			continue
		}
		backoff, err := time.ParseDuration(strings.TrimPrefix(arg, flag))
		if err != nil || backoff <= 0 {
			return nil, fmt.Errorf("%s: a positive duration, such as 10s or 1s", arg)
		}
		jobcontroller.DefaultJobPodFailureBackOff = backoff
	}
	return rest, nil
}
