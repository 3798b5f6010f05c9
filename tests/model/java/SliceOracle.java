// Reads one string per line as hex UTF-16 code units ("0048 0069"), prints "hashCode slice" per line,
// where slice is Akka's sliceForPersistenceId: Math.abs(pid.hashCode() % 1024).
import java.io.BufferedReader;
import java.io.InputStreamReader;

public class SliceOracle {
    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, "US-ASCII"));
        StringBuilder out = new StringBuilder();
        String line;
        while ((line = in.readLine()) != null) {
            StringBuilder s = new StringBuilder();
            for (String unit : line.trim().split(" ")) {
                if (!unit.isEmpty()) s.append((char) Integer.parseInt(unit, 16));
            }
            String pid = s.toString();
            out.append(pid.hashCode()).append(' ').append(Math.abs(pid.hashCode() % 1024)).append('\n');
        }
        System.out.print(out);
    }
}
