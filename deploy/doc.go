// Package deploy holds what an operator installs: the OCI images (package
// images, command tollgate-images), the Helm chart under helm/, the Grafana
// dashboard under grafana/ and the Prometheus rules under prometheus/. Its
// tests render, decode and run them offline.
package deploy
