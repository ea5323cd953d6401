// Command jobset-controller runs the JobSet controller of sigs.k8s.io/jobset (its own
// reconcilers and webhooks, from its module) against the played cluster, as its own main
// does, but for its certificate management: it serves its webhooks on --webhook-port with
// the certificate in --cert-dir, which the cluster registers with the webhook configurations
// its module ships, pointed at that address.
package main

import (
	"context"
	"flag"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	"sigs.k8s.io/jobset/pkg/controllers"
	"sigs.k8s.io/jobset/pkg/webhooks"
)

func main() {
	var port int
	var certDir string
	flag.IntVar(&port, "webhook-port", 9443, "where its webhooks are served, on 127.0.0.1")
	flag.StringVar(&certDir, "cert-dir", "", "the webhooks' tls.crt and tls.key")
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("setup")

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(jobset.AddToScheme(scheme))

	// controller-runtime's own --kubeconfig flag (sigs.k8s.io/controller-runtime/pkg/client/config).
	config, err := ctrl.GetConfig()
	if err != nil {
		log.Error(err, "reading the kubeconfig")
		os.Exit(1)
	}
	// JobSet's own defaults (main.go: --kube-api-qps, --kube-api-burst).
	config.QPS, config.Burst = 500, 500
	mgr, err := ctrl.NewManager(config, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		WebhookServer:          webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: port, CertDir: certDir}),
	})
	if err != nil {
		log.Error(err, "starting the manager")
		os.Exit(1)
	}
	ctx := ctrl.SetupSignalHandler()
	if err := setup(ctx, mgr); err != nil {
		log.Error(err, "setting up the controllers")
		os.Exit(1)
	}
	if err := mgr.Start(ctx); err != nil {
		log.Error(err, "running the manager")
		os.Exit(1)
	}
}

// setup registers what JobSet's main registers (setupControllers): the field indexes its
// reconcilers read, the JobSet and pod reconcilers, and its webhooks.
func setup(ctx context.Context, mgr ctrl.Manager) error {
	if err := controllers.SetupJobSetIndexes(ctx, mgr.GetFieldIndexer()); err != nil {
		return err
	}
	if err := controllers.SetupPodIndexes(ctx, mgr.GetFieldIndexer()); err != nil {
		return err
	}
	jobSets := controllers.NewJobSetReconciler(mgr.GetClient(), mgr.GetScheme(), mgr.GetEventRecorder("jobset"))
	if err := jobSets.SetupWithManager(mgr); err != nil {
		return err
	}
	pods := controllers.NewPodReconciler(mgr.GetClient(), mgr.GetScheme(), mgr.GetEventRecorder("pod"))
	if err := pods.SetupWithManager(mgr); err != nil {
		return err
	}
	return webhooks.Setup(mgr)
}
